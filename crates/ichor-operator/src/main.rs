//! `ichor-operator`: the operator's production binary (what `deploy/Dockerfile` builds).
//! Its command line is [`ichor_operator::cli`]. It links no simulator: the simulated fleet
//! is the `operator` example's (`ichor_sim::fleet`).

fn main() {
    ichor_operator::cli::main();
}
