//! Health gates' evaluation (issue 56 item 1): the shell's half of
//! [`ichor_upgrade_core::gate`]. Each gate's CEL expression is compiled once per pass
//! ([`compile`]: one that does not compile refuses the upgrade, touching nothing) and
//! evaluated over every object the gate reads ([`read`]); what it read enters the core as
//! a [`GateReading`]. Only reads: a gate carries no authority of its own, and what it read
//! is judged in the pass that read it.

use std::collections::BTreeMap;

use cel::{Context, Program, Value};
use ichor_upgrade_core::gate::{GateReading, GateRule, GateSpec, Gates, rules};

use crate::calls::{Executor, bounded};
use crate::cause::report;

/// A gate's compiled expression, with its spec.
pub struct Compiled {
    spec: GateSpec,
    program: Program,
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
            let program = Program::compile(&spec.expression).map_err(|e| {
                let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                format!("gates[{i}] ({}).expression {:?} does not compile: {first}", spec.name, spec.expression)
            })?;
            Ok(Compiled { spec: spec.clone(), program })
        })
        .collect::<Result<_, String>>()?;
    Ok(Checked { rules, compiled })
}

/// The gates of `specs` for the core: their rules and what each reads now, or
/// [`Gates::Invalid`]. `None`: no gates.
pub async fn gates(ex: &Executor<'_>, specs: &[GateSpec]) -> Option<Gates> {
    if specs.is_empty() {
        return None;
    }
    let Checked { rules, compiled } = match compile(specs) {
        Ok(checked) => checked,
        Err(problem) => return Some(Gates::Invalid(problem)),
    };
    let mut readings = BTreeMap::new();
    for gate in &compiled {
        readings.insert(gate.spec.name.clone(), read(ex, gate).await);
    }
    Some(Gates::Rules { rules, readings })
}

/// What `gate` reads now: its objects, and its expression over each.
pub async fn read(ex: &Executor<'_>, gate: &Compiled) -> GateReading {
    let objects = &gate.spec.objects;
    let read = bounded("read a gate's objects", ex.config.call_timeout, ex.kube.gate_objects(objects)).await;
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
        if let Some(value) = evaluate(&gate.program, object).err() {
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

    #[test]
    fn an_expression_holds_fails_or_says_why_it_could_not_be_evaluated() {
        let gates = compile(&[spec("object.status.robustness == 'healthy'")]).unwrap().compiled;
        let program = &gates[0].program;
        assert_eq!(evaluate(program, &json!({ "status": { "robustness": "healthy" } })), Ok(()));
        assert_eq!(evaluate(program, &json!({ "status": { "robustness": "degraded" } })), Err("false".into()));
        let missing = evaluate(program, &json!({ "metadata": {} })).unwrap_err();
        assert!(missing.starts_with("not evaluated: "), "{missing}");
        let not_bool = compile(&[spec("object.status.robustness")]).unwrap().compiled;
        assert!(
            evaluate(&not_bool[0].program, &json!({ "status": { "robustness": "x" } }))
                .unwrap_err()
                .starts_with("not a bool")
        );
        let all = compile(&[spec("object.spec.replicas.all(r, r.healthy)")]).unwrap().compiled;
        assert_eq!(evaluate(&all[0].program, &json!({ "spec": { "replicas": [{ "healthy": true }] } })), Ok(()));
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
