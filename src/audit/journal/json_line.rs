//! An event as the journal's JSON: exactly what `serde_json::to_writer`
//! writes for `AuditEvent` (a test pins it), with the keys written as they
//! are. serde_json escapes every key character by character, and a refused
//! request's row cost some 4,300 instructions to serialise, the keys half
//! of it; the values still go through serde_json's escaping.

use super::super::event::{rfc3339_ms, AuditEvent};

/// Append `event`'s JSON to `out`.
pub(super) fn write(out: &mut Vec<u8>, event: &AuditEvent) {
    out.extend_from_slice(br#"{"id":""#);
    out.extend_from_slice(
        event
            .id
            .hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .as_bytes(),
    );
    out.extend_from_slice(br#"","occurred_at":""#);
    out.extend_from_slice(rfc3339_ms::format(&event.occurred_at).as_bytes());
    out.extend_from_slice(br#"","action":""#);
    out.extend_from_slice(event.action.as_str().as_bytes());
    out.extend_from_slice(br#"","decision":""#);
    out.extend_from_slice(event.decision.as_str().as_bytes());
    out.extend_from_slice(br#"","reason":"#);
    text(out, &event.reason);
    out.extend_from_slice(br#","subject_kind":""#);
    out.extend_from_slice(event.subject_kind.as_str().as_bytes());
    out.extend_from_slice(br#"","subject":"#);
    text(out, &event.subject);
    out.extend_from_slice(br#","ip":"#);
    optional_text(out, event.ip.as_deref());
    out.extend_from_slice(br#","rule":"#);
    optional_text(out, event.rule.as_deref());
    out.extend_from_slice(br#","observed":"#);
    number(out, event.observed);
    out.extend_from_slice(br#","limit":"#);
    number(out, event.limit);
    out.extend_from_slice(br#","window_ms":"#);
    number(out, event.window_ms);
    out.extend_from_slice(br#","retry_after_ms":"#);
    number(out, event.retry_after_ms);
    out.extend_from_slice(br#","request_id":"#);
    optional_text(out, event.request_id.as_deref());
    out.extend_from_slice(br#","user_agent":"#);
    optional_text(out, event.user_agent.as_deref());
    out.extend_from_slice(if event.shadow {
        br#","shadow":true,"actor":"#
    } else {
        br#","shadow":false,"actor":"#
    });
    optional_text(out, event.actor.as_deref());
    out.push(b'}');
}

/// A JSON string, escaped by serde_json.
fn text(out: &mut Vec<u8>, value: &str) {
    // Writing to a Vec cannot fail; serde_json fails only on its writer.
    let _ = serde_json::to_writer(&mut *out, value);
}

fn optional_text(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(value) => text(out, value),
        None => out.extend_from_slice(b"null"),
    }
}

fn number(out: &mut Vec<u8>, value: Option<i64>) {
    match value {
        Some(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::event::AuditDecision;
    use crate::domain::{Action, Reason, Subject, SubjectKind};

    fn written(event: &AuditEvent) -> String {
        let mut out = Vec::new();
        write(&mut out, event);
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn the_line_is_what_serde_writes() {
        let (kinds, decisions, actions) = (SubjectKind::ALL, AuditDecision::ALL, Action::ALL);
        let awkward =
            "quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7} é 漢 \u{2028} 🦀";
        let mut events = Vec::new();
        for (i, kind) in kinds.into_iter().enumerate() {
            for (j, decision) in decisions.into_iter().enumerate() {
                let action = actions[(i + j) % actions.len()];
                let subject = Subject::new(
                    kind,
                    if j % 2 == 0 {
                        "+8613800138000"
                    } else {
                        awkward
                    },
                );
                let event = AuditEvent::new(action, decision, Reason::RateLimited, &subject);
                events.push(event.clone());
                let mut full = event;
                full.reason = awkward.to_string();
                full.ip = Some("2001:db8::1".into());
                full.rule = Some("phone 5/1h".into());
                full.observed = Some(i64::MIN);
                full.limit = Some(i64::MAX);
                full.window_ms = Some(0);
                full.retry_after_ms = Some(-1);
                full.request_id = Some(awkward.into());
                full.user_agent = Some("Mozilla/5.0 \"x\"".into());
                full.shadow = j % 2 == 1;
                full.actor = Some("oidc:ann@example.com".into());
                events.push(full);
            }
        }
        for event in &events {
            let line = written(event);
            assert_eq!(line, serde_json::to_string(event).expect("JSON"));
            let read: AuditEvent = serde_json::from_str(&line).expect("read back");
            assert_eq!(&read, event);
        }
    }
}
