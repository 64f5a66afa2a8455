//! The operator, as `cargo run --example operator` runs it: the `ichor-operator` binary's
//! command line ([`ichor_operator::cli`]) with the simulated fleet (`--simulate-fleet`,
//! the crate's feature `fleet`) built in, so that it can be tried on any API server.

fn main() {
    ichor_operator::cli::main();
}
