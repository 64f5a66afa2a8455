//! Health gates' evaluation (issue 56 item 1): the shell's half of
//! [`ichor_upgrade_core::gate`]. Each gate's CEL expression is compiled once per pass
//! ([`compile`]: one that does not compile refuses the upgrade, touching nothing) and
//! evaluated over every object the gate reads ([`read`]); what it read enters the core as
//! a [`GateReading`]. Only reads: a gate carries no authority of its own, and what it read
//! is judged in the pass that read it.

use std::collections::BTreeMap;
use std::time::Duration;

use cel::{Context, Program, Value};
use ichor_upgrade_core::gate::{GateObjects, GateReading, GateRule, GateSpec, Gates, rules};

use crate::alert_gates::AlertGate;
use crate::calls::{Executor, bounded};
use crate::cause::report;
use crate::kube_api::KubeApi;

/// A gate's compiled expression, or its parsed alert matchers, with its spec.
pub struct Compiled {
    spec: GateSpec,
    reads: Reads,
}

/// What a gate reads, ready.
enum Reads {
    /// Objects, and the expression each must hold.
    Objects(GateObjects, Program),
    /// Alerts ([`crate::alert_gates`]).
    Alerts(AlertGate),
}

impl Compiled {
    /// The gate as written.
    #[must_use]
    pub fn spec(&self) -> &GateSpec {
        &self.spec
    }

    /// Its alerts, parsed, when it is an alert gate.
    #[must_use]
    pub fn alerts(&self) -> Option<&AlertGate> {
        match &self.reads {
            Reads::Alerts(gate) => Some(gate),
            Reads::Objects(..) => None,
        }
    }
}

/// The gates of `specs`: their rules for the core, and each compiled.
pub struct Checked {
    /// What the core holds each gate to.
    pub rules: Vec<GateRule>,
    /// Each gate's compiled expression, in the order of `specs`.
    pub compiled: Vec<Compiled>,
}

/// Every gate of `specs` checked and compiled, or what keeps one from reading (naming
/// the gate).
///
/// # Errors
/// A spec [`rules`] refuses, or an expression that does not compile.
pub fn compile(specs: &[GateSpec]) -> Result<Checked, String> {
    let rules = rules(specs)?;
    let compiled = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let at = format!("gates[{i}] ({})", spec.name);
            let reads = match (&spec.objects, &spec.alerts) {
                (_, Some(alerts)) => Reads::Alerts(crate::alert_gates::compile(alerts, &at)?),
                (objects, None) => {
                    let program = Program::compile(&spec.expression).map_err(|e| {
                        let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                        format!("{at}.expression {:?} does not compile: {first}", spec.expression)
                    })?;
                    // `rules` refuses a gate with neither.
                    Reads::Objects(objects.clone().unwrap_or_else(GateObjects::none), program)
                }
            };
            Ok(Compiled { spec: spec.clone(), reads })
        })
        .collect::<Result<_, String>>()?;
    Ok(Checked { rules, compiled })
}

/// What a pass read of its gates.
pub struct GatesRead {
    /// For the core: the rules and what each read now, or [`Gates::Invalid`].
    pub gates: Gates,
    /// The alert gates that hold silences for the machines in their turn
    /// ([`crate::alert_gates::hold_silences`]).
    pub silencing: Vec<(GateSpec, AlertGate)>,
}

/// The gates of `specs`, each read now. `None`: no gates. `identity`: the operation's,
/// whose own silences an alert gate sees through.
pub async fn gates(ex: &Executor<'_>, specs: &[GateSpec], identity: &str) -> Option<GatesRead> {
    if specs.is_empty() {
        return None;
    }
    let Checked { rules, compiled } = match compile(specs) {
        Ok(checked) => checked,
        Err(problem) => return Some(GatesRead { gates: Gates::Invalid(problem), silencing: Vec::new() }),
    };
    let mut readings = BTreeMap::new();
    for gate in &compiled {
        readings.insert(gate.spec.name.clone(), read(ex.kube, ex.config.call_timeout, gate, identity).await);
    }
    let silencing = compiled
        .into_iter()
        .filter_map(|c| match c.reads {
            Reads::Alerts(alerts) if alerts.selector.silence.is_some() => Some((c.spec, alerts)),
            Reads::Alerts(_) | Reads::Objects(..) => None,
        })
        .collect();
    Some(GatesRead { gates: Gates::Rules { rules, readings }, silencing })
}

/// What `gate` reads now through `kube`, each call within `bound`: its objects, and its
/// expression over each; or its alerts (seeing through the silences of the operation
/// `identity`).
pub async fn read(kube: &dyn KubeApi, bound: Duration, gate: &Compiled, identity: &str) -> GateReading {
    let (objects, program) = match &gate.reads {
        Reads::Objects(objects, program) => (objects, program),
        Reads::Alerts(alerts) => {
            return crate::alert_gates::read(kube, bound, alerts, identity, &gate.spec.name).await;
        }
    };
    let read = bounded("read a gate's objects", bound, kube.gate_objects(objects)).await;
    let found = match read {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return GateReading::NotRead { why: report(&e) },
        Err(e) => return GateReading::NotRead { why: e.to_string() },
    };
    if found.is_empty() {
        // A selector that matches nothing may be a typo: never a pass from nothing read.
        return GateReading::Fails { object: objects.kind_name(), value: "no object matches".to_owned() };
    }
    for (id, object) in &found {
        if let Some(value) = evaluate(program, object).err() {
            return GateReading::Fails { object: id.clone(), value };
        }
    }
    GateReading::Holds
}

/// `program` over `object`: `Ok` when it is `true`, else what it came to.
///
/// # Errors
/// Its value when it is not `true` (`false`, or another value), or why it could not be
/// evaluated (a field the object lacks).
pub fn evaluate(program: &Program, object: &serde_json::Value) -> Result<(), String> {
    let mut context = Context::default();
    context.add_variable("object", object).map_err(|e| format!("the object does not convert: {e}"))?;
    match program.execute(&context) {
        Ok(Value::Bool(true)) => Ok(()),
        Ok(Value::Bool(false)) => Err("false".to_owned()),
        Ok(other) => Err(format!("not a bool: {other:?}")),
        Err(e) => Err(format!("not evaluated: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(expression: &str) -> GateSpec {
        serde_json::from_value(json!({
            "name": "volumes",
            "objects": { "apiVersion": "longhorn.io/v1beta2", "kind": "Volume" },
            "expression": expression,
            "phase": "afterMachine",
        }))
        .unwrap()
    }

    fn program_of(gate: &Compiled) -> &Program {
        match &gate.reads {
            Reads::Objects(_, program) => program,
            Reads::Alerts(_) => panic!("an alert gate"),
        }
    }

    #[test]
    fn an_expression_holds_fails_or_says_why_it_could_not_be_evaluated() {
        let gates = compile(&[spec("object.status.robustness == 'healthy'")]).unwrap().compiled;
        let program = program_of(&gates[0]);
        assert_eq!(evaluate(program, &json!({ "status": { "robustness": "healthy" } })), Ok(()));
        assert_eq!(evaluate(program, &json!({ "status": { "robustness": "degraded" } })), Err("false".into()));
        let missing = evaluate(program, &json!({ "metadata": {} })).unwrap_err();
        assert!(missing.starts_with("not evaluated: "), "{missing}");
        let not_bool = compile(&[spec("object.status.robustness")]).unwrap().compiled;
        assert!(
            evaluate(program_of(&not_bool[0]), &json!({ "status": { "robustness": "x" } }))
                .unwrap_err()
                .starts_with("not a bool")
        );
        let all = compile(&[spec("object.spec.replicas.all(r, r.healthy)")]).unwrap().compiled;
        assert_eq!(evaluate(program_of(&all[0]), &json!({ "spec": { "replicas": [{ "healthy": true }] } })), Ok(()));
    }

    #[test]
    fn an_expression_that_does_not_compile_is_refused_naming_the_gate() {
        let Err(problem) = compile(&[spec("object.status.robustness == ")]) else { panic!("compiled") };
        assert!(
            problem.starts_with("gates[0] (volumes).expression \"object.status.robustness == \" does not compile"),
            "{problem}"
        );
    }
}
