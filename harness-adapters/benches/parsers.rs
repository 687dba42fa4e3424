//! Parse throughput of each CLI adapter's event parser over its captured output (MB/s).
//!
//! Run: `cargo bench -p keel-harness --bench parsers`. Each input is one session's real capture
//! repeated to about 4 MiB, fed line by line exactly as the runner does.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keel_harness::cli::EventParser;
use keel_harness::cli::claude::ClaudeParser;
use keel_harness::cli::codex::CodexParser;
use keel_harness::cli::opencode::OpencodeParser;
use keel_harness::cli::pi::PiParser;

const TARGET_BYTES: usize = 4 << 20;

fn input(cli: &str, name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cli")
        .join(cli)
        .join(name);
    let one = std::fs::read(path).unwrap();
    let mut out = Vec::with_capacity(TARGET_BYTES + one.len());
    while out.len() < TARGET_BYTES {
        out.extend_from_slice(&one);
        if !one.ends_with(b"\n") {
            out.push(b'\n');
        }
    }
    out
}

fn parse_all(parser: &mut dyn EventParser, data: &[u8]) -> usize {
    let mut events = Vec::with_capacity(64);
    let mut count = 0;
    for line in data.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let _ = parser.parse_line(line, 0, &mut events);
        count += events.len();
        events.clear();
    }
    count
}

/// (label, fixture dir, fixture file, parser constructor).
type Case = (
    &'static str,
    &'static str,
    &'static str,
    fn() -> Box<dyn EventParser>,
);

fn bench(c: &mut Criterion) {
    let cases: [Case; 4] = [
        ("claude", "claude", "tool-bash.stream-json.jsonl", || {
            Box::new(ClaudeParser::default())
        }),
        (
            "codex",
            "codex",
            "tool-exec_command.exec-json.jsonl",
            || Box::new(CodexParser::default()),
        ),
        (
            "opencode",
            "opencode",
            "tool-bash.run-format-json.jsonl",
            || Box::new(OpencodeParser::default()),
        ),
        ("pi", "pi", "tool-bash.mode-json.jsonl", || {
            Box::new(PiParser::default())
        }),
    ];
    let mut group = c.benchmark_group("parse");
    group.sample_size(10);
    group.measurement_time(std::time::Duration::from_secs(3));
    for (label, cli, name, make) in cases {
        let data = input(cli, name);
        group.throughput(Throughput::Bytes(data.len() as u64));
        group.bench_function(label, |b| {
            b.iter(|| {
                let mut p = make();
                std::hint::black_box(parse_all(p.as_mut(), &data))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
