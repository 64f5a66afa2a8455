//! The integration tests of downstream, one module per file, in one test binary.

mod own_doubles;
mod properties;
