//! `keel`: the command line.
fn main() {}
