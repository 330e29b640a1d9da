//! k15-memory: leak tracking for C++ `new`/`delete` and Rust allocations.

pub mod engine;
