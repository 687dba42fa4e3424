//! Turning a CLI's error text into a typed [`HarnessError`], rate and usage limits first.
//!
//! The CLIs report a model endpoint's failure as prose (`429 fake 429 ...`, `exceeded retry limit,
//! last status: 429 Too Many Requests`, `Claude AI usage limit reached|1767225600`, `You've hit your
//! usage limit ... try again in 2 hours 5 minutes`). The supervisor needs a category, whether to
//! retry and, for limits, when the limit lifts. Pure functions: the current time is an input.

use crate::error::{ErrorCategory, HarnessError};

/// Longest relative reset delay accepted from text (a week): anything longer is a parse accident.
const RESET_DELAY_MS_MAX: u64 = 7 * 24 * 3600 * 1000;

/// Classifies an error message from a CLI, given the HTTP status when the CLI reported one.
/// `now_unix_ms` anchors relative reset times ("try again in 5 minutes").
pub fn classify(
    message: &str,
    status: Option<u16>,
    retry_after_ms: Option<u64>,
    now_unix_ms: u64,
) -> HarnessError {
    let lower = message.to_ascii_lowercase();
    let reset_at = reset_time(message, &lower, now_unix_ms)
        .or_else(|| retry_after_ms.map(|ms| now_unix_ms.saturating_add(ms)));
    let retry_after = retry_after_ms.or_else(|| reset_at.map(|at| at.saturating_sub(now_unix_ms)));
    let status = status.or_else(|| status_in_text(message));
    if is_limit_text(&lower) || status == Some(429) {
        return HarnessError::rate_limited(message, reset_at, retry_after);
    }
    if let Some(code) = status {
        return HarnessError::from_http_status(code, message, retry_after_ms, reset_at);
    }
    let category = if lower.contains("prompt is too long")
        || lower.contains("context window")
        || lower.contains("context_length_exceeded")
        || lower.contains("context length")
    {
        ErrorCategory::ContextOverflow
    } else if lower.contains("invalid_request_error") || lower.contains("bad request") {
        ErrorCategory::BusinessRule
    } else if lower.contains("unauthorized")
        || lower.contains("invalid api key")
        || lower.contains("invalid x-api-key")
        || lower.contains("authentication")
        || lower.contains("not logged in")
    {
        ErrorCategory::Auth
    } else if lower.contains("overloaded")
        || lower.contains("high demand")
        || lower.contains("connection")
        || lower.contains("timed out")
        || lower.contains("timeout")
        || lower.contains("server error")
        || lower.contains("stream disconnected")
        || lower.contains("unable to connect")
    {
        ErrorCategory::Transient
    } else {
        ErrorCategory::System
    };
    HarnessError::new(category, message).with_retry_after_ms(retry_after_ms)
}

/// Whether the text speaks of a rate or usage limit.
pub fn is_limit_text(lower: &str) -> bool {
    lower.contains("rate limit")
        || lower.contains("rate_limit")
        || lower.contains("ratelimit")
        || lower.contains("too many requests")
        || lower.contains("usage limit")
        || lower.contains("hit your limit")
        || lower.contains("limit reached")
        || lower.contains("quota")
}

/// The first HTTP status named in the text: a leading `NNN ` (pi: `429 fake 429 ...`), or after
/// `status:`/`status ` (Codex: `last status: 429 Too Many Requests`), or `(NNN)` (Claude:
/// `Request rejected (429)`).
pub fn status_in_text(message: &str) -> Option<u16> {
    let valid = |s: &str| s.parse::<u16>().ok().filter(|c| (400..600).contains(c));
    let lead: String = message.chars().take_while(char::is_ascii_digit).collect();
    if lead.len() == 3
        && message[3..].starts_with([' ', ':'])
        && let Some(c) = valid(&lead)
    {
        return Some(c);
    }
    let lower = message.to_ascii_lowercase();
    for key in ["status: ", "status ", "status code ", "statuscode: "] {
        if let Some(i) = lower.find(key) {
            let digits: String = lower[i + key.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Some(c) = valid(&digits) {
                return Some(c);
            }
        }
    }
    let bytes = message.as_bytes();
    for (i, w) in bytes.windows(5).enumerate() {
        if w[0] == b'('
            && w[4] == b')'
            && w[1..4].iter().all(u8::is_ascii_digit)
            && let Some(c) = message.get(i + 1..i + 4).and_then(valid)
        {
            return Some(c);
        }
    }
    None
}

/// The reset time (Unix ms) a limit message states, if any.
///
/// Understood: `...|<unix seconds>` (Claude Code's usage-limit line), `try again in <duration>` and
/// `retry after <duration>` / `resets in <duration>` with units ms, s, sec(ond)s, m, min(ute)s, h,
/// hour(s), d, day(s). Wall-clock forms such as `resets 3pm (Europe/Berlin)` need a time-zone
/// database and are not parsed: the limit is still reported, with no reset time.
pub fn reset_time(message: &str, lower: &str, now_unix_ms: u64) -> Option<u64> {
    if let Some((_, tail)) = message.rsplit_once('|') {
        let digits: String = tail
            .trim()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if (9..=11).contains(&digits.len())
            && let Ok(secs) = digits.parse::<u64>()
        {
            return Some(secs.saturating_mul(1000));
        }
    }
    for key in ["try again in ", "retry after ", "resets in ", "retry in "] {
        if let Some(i) = lower.find(key)
            && let Some(ms) = parse_duration_ms(&lower[i + key.len()..])
            && ms <= RESET_DELAY_MS_MAX
        {
            return Some(now_unix_ms.saturating_add(ms));
        }
    }
    None
}

/// Parses a leading human duration ("2 days 3 hours 5 minutes", "1.5s", "5m30s", "20ms").
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let mut rest = text.trim_start();
    let mut total: f64 = 0.0;
    let mut parts = 0;
    // Bounded: each iteration consumes at least one character, and at most 8 parts are read.
    while parts < 8 {
        let num: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        if num.is_empty() {
            break;
        }
        let Ok(value) = num.parse::<f64>() else { break };
        rest = rest[num.len()..].trim_start();
        let unit: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
        let factor = match unit.as_str() {
            "ms" | "millisecond" | "milliseconds" => 1.0,
            "s" | "sec" | "secs" | "second" | "seconds" => 1000.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
            "d" | "day" | "days" => 86_400_000.0,
            _ => break,
        };
        total += value * factor;
        parts += 1;
        rest = rest[unit.len()..].trim_start_matches([' ', ',']);
        rest = rest.strip_prefix("and ").unwrap_or(rest);
    }
    if parts == 0 || !total.is_finite() || total < 0.0 {
        return None;
    }
    // Saturating float-to-int conversion: `as` clamps, which is what a bound wants.
    Some(total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn check(message: &str, status: Option<u16>, expected: ErrorCategory) {
        assert_eq!(
            classify(message, status, None, NOW).category,
            expected,
            "{message}"
        );
    }

    #[test]
    fn limit_messages_from_each_cli() {
        check(
            "429 fake 429 from test server",
            None,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: None,
            },
        );
        check(
            "exceeded retry limit, last status: 429 Too Many Requests",
            None,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: None,
            },
        );
        check(
            "API Error: Request rejected (429) · fake 429 from test server",
            None,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: None,
            },
        );
        check(
            "Claude AI usage limit reached|1800003600",
            None,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: Some(1_800_003_600_000),
            },
        );
        check(
            "You've hit your usage limit. Upgrade to Pro or try again in 2 hours 5 minutes.",
            None,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: Some(NOW + 7_500_000),
            },
        );
        check(
            "Rate limit reached for gpt-5 on tokens per min. Please try again in 1.5s.",
            None,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: Some(NOW + 1_500),
            },
        );
        check(
            "5-hour limit reached ∙ resets 3pm",
            None,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: None,
            },
        );
    }

    #[test]
    fn other_failures() {
        check(
            "500 fake 500 from test server",
            None,
            ErrorCategory::Transient,
        );
        check(
            "We’re currently experiencing high demand, which may cause temporary errors.",
            None,
            ErrorCategory::Transient,
        );
        check("Connection error.", None, ErrorCategory::Transient);
        check("400 bad request", None, ErrorCategory::BusinessRule);
        check(
            "Invalid API key · Please run /login",
            None,
            ErrorCategory::Auth,
        );
        check("something odd", None, ErrorCategory::System);
        check("x", Some(401), ErrorCategory::Auth);
    }

    #[test]
    fn retry_after_sets_the_reset() {
        let e = classify("fake 429", Some(429), Some(1000), NOW);
        assert_eq!(
            e.category,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: Some(NOW + 1000)
            }
        );
        assert_eq!(e.retry_after_ms, Some(1000));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("5m30s"), Some(330_000));
        assert_eq!(parse_duration_ms("20ms."), Some(20));
        assert_eq!(
            parse_duration_ms("1 day, 2 hours and 3 minutes"),
            Some(93_780_000)
        );
        assert_eq!(parse_duration_ms("soon"), None);
    }
}
