//! `keel-sim`: runs seeds of the deterministic simulator.
fn main() {}
