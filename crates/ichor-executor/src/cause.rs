//! Causes kept whole: a cloneable, comparable holder of an error and its `source()` chain,
//! and a one-line report of a whole chain.
//!
//! A failed call's classification (unreachable, TLS, answered) drives what the engine does;
//! its cause is what a person needs to read ("connection refused", "unknown issuer",
//! "certificate expired"). Errors here carry both: the kind as the variant, the cause as a
//! [`Cause`] behind `#[source]`, and [`report`] prints the chain in one line for a status
//! message, an Event or a command's output.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// The cause of a failure, with its whole source chain. Clones share it; two causes are
/// equal when their reports read the same, so that errors carrying one can still derive
/// `Clone`, `PartialEq` and `Eq`.
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync + 'static>);

impl Cause {
    /// Keeps `error` itself, with its chain.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// A cause known only by its text (a simulated or test failure, or a peer's message).
    pub fn message(text: impl Into<String>) -> Self {
        Self(Arc::new(Level { text: text.into(), next: None }))
    }

    /// A copy of `error`'s chain, level by level, as text: for an error that cannot be
    /// moved or cloned (one borrowed from a gRPC status), so that nothing of it is lost.
    #[must_use]
    pub fn capture(error: &(dyn Error + 'static)) -> Self {
        let mut texts = Vec::new();
        let mut level = Some(error);
        while let Some(e) = level {
            texts.push(e.to_string());
            level = e.source();
        }
        let chain = texts.into_iter().rev().fold(None, |next, text| Some(Level { text, next: next.map(Box::new) }));
        Self(Arc::new(chain.unwrap_or(Level { text: String::new(), next: None })))
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&report(self))
    }
}

impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        // The cause displays as the error it holds, so its chain goes on below that error.
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        report(self) == report(other)
    }
}

impl Eq for Cause {}

/// One level of a captured chain.
#[derive(Debug)]
struct Level {
    text: String,
    next: Option<Box<Self>>,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Error for Level {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.next.as_deref().map(|next| next as &(dyn Error + 'static))
    }
}

/// `error` and every source below it on one line, joined by `": "`. A level whose text the
/// line already holds (an error that prints its source itself) is not repeated.
#[must_use]
pub fn report(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(level) = source {
        let text = level.to_string();
        if !text.is_empty() && !line.to_lowercase().contains(&text.to_lowercase()) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        source = level.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading node cp-1")]
    struct Outer {
        #[source]
        cause: Cause,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("dial 10.5.0.2:50000: {0}")]
    struct PrintsItsSource(#[source] std::io::Error);

    #[test]
    fn a_report_walks_the_whole_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let outer = Outer { cause: Cause::new(PrintsItsSource(io)) };
        assert_eq!(report(&outer), "reading node cp-1: dial 10.5.0.2:50000: connection refused");
    }

    #[test]
    fn a_captured_chain_keeps_every_level_and_compares_by_text() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "os said no");
        let live = Cause::new(PrintsItsSource(io));
        let captured = Cause::capture(&live);
        assert_eq!(report(&captured), "dial 10.5.0.2:50000: os said no");
        assert_eq!(captured, live);
        assert_ne!(captured, Cause::message("dial 10.5.0.2:50000"));
        let mut levels = 1;
        let mut level = captured.source();
        while let Some(e) = level {
            levels += 1;
            level = e.source();
        }
        assert_eq!(levels, 2, "the captured copy is a chain, not one flattened line");
    }
}
