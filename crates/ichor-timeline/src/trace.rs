//! Reading a trace: JSON lines, one record per change, as the simulator and the operator
//! write them (`rollout --trace FILE`, `operator --trace FILE`).

use std::io::BufRead;

use serde::Deserialize;

/// One record of a trace, as written. Only `t`, `node`, `role` and `event` are required;
/// unknown fields and events are kept or ignored, so that a newer trace still draws.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceRecord {
    /// Seconds since the start of the trace.
    pub t: f64,
    /// The node, or `operation`, `controller`, `cluster` for what is not one node's.
    pub node: String,
    /// `control-plane`, `worker`, `operation`, `controller` or `cluster`.
    pub role: String,
    /// What happened, such as `upgrade-call` or `reboot-end`.
    pub event: String,
    /// The node's Talos version, where known.
    #[serde(default)]
    pub version: Option<String>,
    /// Why (failures, pauses, waits): the CamelCase reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// The message for people.
    #[serde(default)]
    pub message: Option<String>,
    /// For an `evacuation-start`: the bytes the evacuation moves off the node, where
    /// known.
    #[serde(default)]
    pub bytes: Option<u64>,
}

impl TraceRecord {
    /// A record with no version, reason or message.
    #[must_use]
    pub fn new(t: f64, node: &str, role: &str, event: &str) -> Self {
        Self {
            t,
            node: node.to_owned(),
            role: role.to_owned(),
            event: event.to_owned(),
            version: None,
            reason: None,
            message: None,
            bytes: None,
        }
    }

    /// The same record with a reason.
    #[must_use]
    pub fn with_reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }

    /// Whether the record is about a machine (a control plane or a worker).
    #[must_use]
    pub fn is_machine(&self) -> bool {
        self.role == CONTROL_PLANE || self.role == WORKER
    }
}

/// The role of a control-plane machine in a trace.
pub const CONTROL_PLANE: &str = "control-plane";
/// The role of a worker machine in a trace.
pub const WORKER: &str = "worker";

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace could not be read.
    #[error("reading the trace: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a trace record.
    #[error("line {line}: not a trace record: {source}")]
    Record {
        /// The line, from 1.
        line: usize,
        /// What was wrong with it.
        #[source]
        source: serde_json::Error,
    },
    /// A record's time is not a number of seconds from the start.
    #[error("line {line}: time {t} is not a number of seconds from the start")]
    Time {
        /// The line, from 1.
        line: usize,
        /// The time it gives.
        t: f64,
    },
    /// Nothing in the trace is about a machine.
    #[error("the trace has no record of any machine (control-plane or worker)")]
    NoMachines,
}

/// Reads a trace of JSON lines (blank lines are skipped). Records may come in any order;
/// they are sorted by time, keeping the order of records with the same time.
///
/// # Errors
/// [`TraceError`] naming the first line that is not a record, or a time that is negative
/// or not finite, or a trace with no machine in it.
pub fn read_trace(reader: impl BufRead) -> Result<Vec<TraceRecord>, TraceError> {
    let mut records = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record: TraceRecord =
            serde_json::from_str(&line).map_err(|source| TraceError::Record { line: index + 1, source })?;
        if !record.t.is_finite() || record.t < 0.0 {
            return Err(TraceError::Time { line: index + 1, t: record.t });
        }
        records.push(record);
    }
    if !records.iter().any(TraceRecord::is_machine) {
        return Err(TraceError::NoMachines);
    }
    records.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_records_skipping_blank_lines_and_sorting_by_time() {
        let text = r#"{"t":5.0,"node":"w-1","role":"worker","event":"ready","extra":1}

{"t":1.5,"node":"w-1","role":"worker","event":"upgrade-call","version":"v1.14.3"}
"#;
        let records = read_trace(text.as_bytes()).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].event, "upgrade-call");
        assert_eq!(records[0].version.as_deref(), Some("v1.14.3"));
        assert_eq!(records[1].t, 5.0);
    }

    #[test]
    fn a_bad_line_is_named() {
        let text = "{\"t\":1,\"node\":\"a\",\"role\":\"worker\",\"event\":\"x\"}\n{\"t\":2,\"node\":\"a\"}\n";
        let error = read_trace(text.as_bytes()).unwrap_err();
        assert!(matches!(error, TraceError::Record { line: 2, .. }), "{error}");
        assert!(error.to_string().starts_with("line 2: not a trace record"), "{error}");
    }

    #[test]
    fn a_negative_time_is_refused() {
        let text = "{\"t\":-1,\"node\":\"a\",\"role\":\"worker\",\"event\":\"x\"}\n";
        assert!(matches!(read_trace(text.as_bytes()), Err(TraceError::Time { line: 1, .. })));
    }

    #[test]
    fn a_trace_without_machines_is_refused() {
        let text = "{\"t\":1,\"node\":\"controller\",\"role\":\"controller\",\"event\":\"controller-restart\"}\n";
        assert!(matches!(read_trace(text.as_bytes()), Err(TraceError::NoMachines)));
        assert!(matches!(read_trace(&b""[..]), Err(TraceError::NoMachines)));
    }
}
