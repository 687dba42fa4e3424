//! Parse throughput of the messages-api stream parser (MB/s): the SSE framing alone, and SSE plus
//! assembling the Anthropic message (text deltas, tool input deltas, usage).
//!
//! Run: `cargo bench -p keel-harness --bench sse`. The input is a synthetic stream shaped like a real
//! answer (many small `text_delta` events, a tool call streamed as `input_json_delta` fragments),
//! about 4 MiB, fed in 16 KiB chunks as the HTTP client delivers them.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keel_harness::messages_api::sse::SseParser;
use keel_harness::messages_api::stream::MessageAssembler;
use serde_json::json;

const TARGET_BYTES: usize = 4 << 20;
const CHUNK_BYTES: usize = 16 * 1024;

fn event(name: &str, data: serde_json::Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn stream() -> Vec<u8> {
    let mut s = event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_bench", "model": "m",
        "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    );
    s += &event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    let piece = "The quick brown fox jumps over the lazy dog; ";
    while s.len() < TARGET_BYTES / 2 {
        s += &event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        );
    }
    s += &event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    s += &event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}}),
    );
    s += &event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"a.txt\", \"content\": \""}}),
    );
    while s.len() < TARGET_BYTES {
        s += &event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "line of file content\\n"}}),
        );
    }
    s += &event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"}"}}),
    );
    s += &event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 1}),
    );
    s += &event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 99}}),
    );
    s += &event("message_stop", json!({"type": "message_stop"}));
    s.into_bytes()
}

fn bench(c: &mut Criterion) {
    let data = stream();
    let mut group = c.benchmark_group("messages_api_stream");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(20);
    group.bench_function("sse_framing", |b| {
        b.iter(|| {
            let mut parser = SseParser::new();
            let mut frames = Vec::new();
            let mut count = 0usize;
            for chunk in data.chunks(CHUNK_BYTES) {
                parser.feed(chunk, &mut frames).unwrap();
                count += frames.len();
                frames.clear();
            }
            black_box(count)
        })
    });
    group.bench_function("sse_and_assemble", |b| {
        b.iter(|| {
            let mut parser = SseParser::new();
            let mut assembler = MessageAssembler::new();
            let mut frames = Vec::new();
            for chunk in data.chunks(CHUNK_BYTES) {
                parser.feed(chunk, &mut frames).unwrap();
                for f in frames.drain(..) {
                    assembler.apply(&f).unwrap();
                }
            }
            black_box(assembler.finish().unwrap())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
