//! Context continuity: bounded, secret-scrubbed preambles built from store rows (DESIGN.md §6).
