//! `ichor-operator`: the operator's production binary (what `deploy/Dockerfile` builds).
//! Its command line is [`ichor_operator::cli`]; the simulated fleet is in it only when the
//! crate's feature `fleet` is on (the `operator` example turns it on).

fn main() {
    ichor_operator::cli::main();
}
