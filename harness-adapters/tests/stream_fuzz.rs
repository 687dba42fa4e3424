//! Property tests over arbitrary input: the SSE parser, the stream assembler and the scripted
//! model's request reduction never panic, and SSE framing does not depend on how bytes are chunked.
#![cfg(feature = "io")]
// Sessions, servers and processes: the IO half of the crate.

// Test helpers panic on setup failure by design: a broken fixture must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_harness::messages_api::sse::{SseFrame, SseParser};
use keel_harness::messages_api::stream::MessageAssembler;
use keel_harness::scripted::{ModelRequest, Script, ScriptedModel, WireApi};
use proptest::prelude::*;

fn frames_of(chunks: &[&[u8]]) -> Result<Vec<SseFrame>, String> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        parser.feed(c, &mut out).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Text built from SSE-ish pieces, so the properties explore real structure, not only noise.
fn sse_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("event: message_start\n".to_owned()),
        Just("event: content_block_delta\n".to_owned()),
        Just("data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n".to_owned()),
        Just("data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n".to_owned()),
        Just("data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\"}}\n".to_owned()),
        Just("data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n".to_owned()),
        Just(": comment\n".to_owned()),
        Just("\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("\r".to_owned()),
        "[ -~]{0,20}",
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(frames) = frames_of(&[&bytes]) {
            let mut asm = MessageAssembler::new();
            for f in &frames {
                if asm.apply(f).is_err() {
                    break;
                }
            }
            let _ = asm.finish();
        }
    }

    #[test]
    fn framing_is_independent_of_chunking(text in sse_text(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let bytes = text.as_bytes();
        let whole = frames_of(&[bytes]);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut last = 0;
        for p in points {
            chunks.push(&bytes[last..p]);
            last = p;
        }
        chunks.push(&bytes[last..]);
        prop_assert_eq!(whole, frames_of(&chunks));
    }

    #[test]
    fn structured_streams_assemble_or_fail_typed(text in sse_text()) {
        if let Ok(frames) = frames_of(&[text.as_bytes()]) {
            let mut asm = MessageAssembler::new();
            let mut ok = true;
            for f in &frames {
                if asm.apply(f).is_err() {
                    ok = false;
                    break;
                }
            }
            if ok {
                let _ = asm.finish();
            }
        }
    }

    #[test]
    fn arbitrary_json_requests_get_an_answer(json in "[ -~]{0,300}") {
        let body: serde_json::Value = serde_json::from_str(&json).unwrap_or(serde_json::Value::Null);
        for wire in [WireApi::AnthropicMessages, WireApi::OpenAiResponses, WireApi::OpenAiChat] {
            let request = ModelRequest::from_body(wire, &body);
            let _ = ScriptedModel::new(Script::rules()).respond(&request);
        }
    }
}
