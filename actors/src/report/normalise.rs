//! Reading a report a real model wrote slightly off: the common variants (a confidence as a
//! fraction or a percentage, a status in other words or case, a missing list or task id, a gap
//! given as one string) are brought to the report's shape, and each change is said in words so the
//! specialist can record it. Anything else is left as it is, to fail the strict parse with its
//! exact error. Pure: no IO.

use serde_json::{Map, Value};

/// Normalises one report candidate (a JSON object) in place, filling a missing `subtask_id` with
/// `expected` when given; returns what it changed, one phrase each (empty when nothing was).
pub(crate) fn normalise(value: &mut Value, expected: Option<&str>) -> Vec<String> {
    let mut notes = Vec::new();
    let Some(report) = value.as_object_mut() else {
        return notes;
    };
    if let Some(expected) = expected
        && matches!(report.get("subtask_id"), None | Some(Value::Null))
    {
        report.insert("subtask_id".into(), Value::String(expected.to_owned()));
        notes.push("subtask_id missing: read as this task".to_owned());
    }
    if let Some(Value::String(status)) = report.get("status") {
        let word = status.trim().to_ascii_lowercase();
        let read = match word.as_str() {
            "complete" | "completed" | "done" | "success" | "succeeded" => "complete",
            "partial" | "partially_complete" | "incomplete" => "partial",
            "blocked" | "failed" | "stuck" => "blocked",
            _ => "",
        };
        if !read.is_empty() && read != status {
            notes.push(format!("status {status:?} read as {read:?}"));
            report.insert("status".into(), Value::String(read.into()));
        }
    }
    for list in ["findings", "gaps"] {
        match report.get(list) {
            None | Some(Value::Null) => {
                notes.push(format!("{list} missing: read as none"));
                report.insert(list.into(), Value::Array(Vec::new()));
            }
            Some(Value::String(one)) if list == "gaps" => {
                notes.push("gaps given as one text: read as one gap".to_owned());
                let one = Value::String(one.clone());
                report.insert(list.into(), Value::Array(vec![one]));
            }
            _ => {}
        }
    }
    if matches!(report.get("summary"), None | Some(Value::Null)) {
        notes.push("summary missing: read as empty".to_owned());
        report.insert("summary".into(), Value::String(String::new()));
    }
    if let Some(Value::Array(findings)) = report.get_mut("findings") {
        for (i, finding) in findings.iter_mut().enumerate() {
            if let Some(finding) = finding.as_object_mut() {
                finding_notes(i, finding, &mut notes);
            }
        }
    }
    notes
}

/// A finding's confidence in per-mille from the ways models write it: a fraction (0.9), a
/// percentage ("90%" or 90 under `confidence`), per-mille as a float (900.0) or as text ("900").
fn finding_notes(index: usize, finding: &mut Map<String, Value>, notes: &mut Vec<String>) {
    let (key, given) = match (
        finding.get("confidence_permille"),
        finding.get("confidence"),
    ) {
        (Some(v), _) if !v.is_null() => ("confidence_permille", v.clone()),
        (_, Some(v)) if !v.is_null() => ("confidence", v.clone()),
        _ => return,
    };
    if key == "confidence_permille" && given.as_u64().is_some() {
        return; // already what the report wants
    }
    let (number, percent) = match &given {
        Value::Number(n) => (n.as_f64(), false),
        Value::String(s) => {
            let t = s.trim();
            match t.strip_suffix('%') {
                Some(p) => (p.trim().parse::<f64>().ok(), true),
                None => (t.parse::<f64>().ok(), false),
            }
        }
        _ => (None, false),
    };
    let Some(x) = number.filter(|x| x.is_finite() && *x >= 0.0) else {
        return;
    };
    let permille = if percent || (key == "confidence" && x > 1.0 && x <= 100.0) {
        x * 10.0
    } else if x <= 1.0 {
        x * 1000.0
    } else {
        x
    };
    if permille > 1000.0 {
        return; // out of range: left for the check to refuse with its own error
    }
    // In range 0..=1000 after the check above, so the cast cannot truncate.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let permille = permille.round() as u64;
    finding.remove("confidence");
    finding.insert("confidence_permille".into(), Value::from(permille));
    notes.push(format!(
        "finding {index}: {key} {given} read as {permille} per mille"
    ));
}
