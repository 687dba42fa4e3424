//! What scrubbing at ingest costs (issue 16): the specialist scrubs every harness event before it
//! becomes a row, so this is paid on every byte of tool output a session produces. Target: above
//! 100 MB/s of tool output with ten registered credentials, so that it disappears next to a model
//! call (a few hundred bytes per millisecond at most).
//!
//! The input is what tools print: source code, build and test logs, JSON, paths, shas and UUIDs, with
//! a secret in one line of two hundred (scrubbing a text with nothing to remove is the common case;
//! one with many findings costs a copy more).
//!
//! Run: `cargo bench -p keel-actors --bench ingest`.

// A benchmark whose set-up fails has nothing to measure: it stops at once.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keel_actors::context::Scrubber;
use keel_actors::specialist::scrub_event;
use keel_harness::HarnessEvent;

/// One kind of tool output line each, cycled.
const LINES: [&str; 8] = [
    "    fn handle(&mut self, input: SpecialistInput, now: Millis) -> Result<(), Error> {",
    "   Compiling keel-actors v0.1.0 (/home/dev/keel/actors)",
    "test context::scrub::tests::entropy_of_repeated_char_is_zero ... ok",
    "{\"path\":\"src/lib.rs\",\"line\":42,\"kind\":\"warning\",\"message\":\"unused import\"}",
    "commit 3f2a9c4e5b6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f Author: dev <dev@example.com>",
    "request 8c4f2b1e-9a7d-4e3c-b2a1-0f9e8d7c6b5a took 12 ms (status 200, 1.2 KiB)",
    "let token_ttl = config.session.token_ttl_seconds; // password reset in 3600 s",
    "drwxr-xr-x  4 dev dev  4096 Nov 29 10:12 /home/dev/keel/target/debug/deps",
];

fn tool_output(bytes: usize) -> String {
    let secret = ["sk", "ant", "api03", "Zq3xT9vLm2Kp8RwYc4Nf6Hd1Gs5Bj7Ue0Ao"].join("-");
    let mut text = String::with_capacity(bytes + 128);
    let mut i = 0usize;
    while text.len() < bytes {
        if i % 200 == 199 {
            text.push_str("export ANTHROPIC_API_KEY=");
            text.push_str(&secret);
        } else {
            text.push_str(LINES[i % LINES.len()]);
        }
        text.push('\n');
        i += 1;
    }
    text
}

fn ten_registered() -> Scrubber {
    let mut scrubber = Scrubber::new();
    for i in 0..10 {
        scrubber
            .register_secret(&format!("acct-{i:02}-kq7Zt4pW9xL2mKc8RvN3bH6yF1sJ5d"))
            .unwrap();
    }
    scrubber
}

fn benches(c: &mut Criterion) {
    let scrubber = ten_registered();
    let mut group = c.benchmark_group("ingest");
    for bytes in [16 * 1024, 1024 * 1024] {
        let text = tool_output(bytes);
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(format!("scrub_tool_output_{}k", bytes / 1024), |b| {
            b.iter(|| black_box(scrubber.scrub(black_box(&text))))
        });
    }
    // The whole ingest step for a tool result at keel-harness's bound (16 KiB kept per result).
    let text = tool_output(16 * 1024);
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("scrub_event_tool_result_16k", |b| {
        b.iter(|| {
            let event = HarnessEvent::tool_result("t1", false, text.clone());
            black_box(scrub_event(&scrubber, black_box(event)))
        })
    });
    group.finish();
}

criterion_group!(ingest, benches);
criterion_main!(ingest);
