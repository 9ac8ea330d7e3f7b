//! The one codec of every header value Chime writes or reads (feature `amqp`): the names are in
//! [`crate::wire`], the AMQP value types here.
//!
//! Chime writes an attempt as an unsigned 32-bit integer, a term, an instant (Unix
//! milliseconds) and a count as integers, and a text as a long string cut to
//! [`crate::limits::MAX_HEADER_VALUE_BYTES`]. It reads an integer whatever integer type the
//! publisher chose (or its decimal text: another language's client may send one), since only
//! the value is the contract.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable};

use crate::limits::cap_header_value;
use crate::wire::{HEADER_ATTEMPT, HEADER_NOT_BEFORE, HEADER_TERM};

/// A header that is present but holds no integer (so a forged value can be told from a
/// missing one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("header is not an integer")]
pub struct NotAnInteger;

/// An integer header value, whatever integer type the publisher chose, an AMQP timestamp, or
/// an integer written as text; `None` for anything else.
pub fn integer(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::ShortShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::Timestamp(v) => i64::try_from(*v).ok(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
        AMQPValue::ShortString(s) => s.as_str().parse().ok(),
        _ => None,
    }
}

/// Header `name` of `headers` as an integer: `Ok(None)` when absent, an error when present but
/// not an integer.
pub fn get_integer(headers: Option<&FieldTable>, name: &str) -> Result<Option<i64>, NotAnInteger> {
    match headers.and_then(|h| h.inner().get(name)) {
        None => Ok(None),
        Some(value) => integer(value).map(Some).ok_or(NotAnInteger),
    }
}

/// A text header value (a long string, lossily decoded, or a short string); `None` for
/// anything else.
pub fn text(value: &AMQPValue) -> Option<Cow<'_, str>> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes())),
        AMQPValue::ShortString(s) => Some(Cow::Borrowed(s.as_str())),
        _ => None,
    }
}

/// An instant header value (Unix milliseconds), such as `x-chime-not-before`; `None` when absent,
/// not an integer, or outside chrono's range.
pub fn get_instant(headers: Option<&FieldTable>, name: &str) -> Option<DateTime<Utc>> {
    let ms = get_integer(headers, name).ok().flatten()?;
    DateTime::from_timestamp_millis(ms)
}

/// An attempt number as Chime writes it (`x-chime-attempt`).
pub fn attempt_value(attempt: u32) -> AMQPValue {
    AMQPValue::LongUInt(attempt)
}

/// An instant as Chime writes it (`x-chime-not-before`, `x-chime-parked-at`): Unix milliseconds.
pub fn instant_value(at: DateTime<Utc>) -> AMQPValue {
    millis_value(at.timestamp_millis())
}

/// Unix milliseconds as Chime writes them.
pub fn millis_value(ms: i64) -> AMQPValue {
    AMQPValue::LongLongInt(ms)
}

/// A leader term as Chime writes it (`x-chime-term`).
pub fn term_value(term: i64) -> AMQPValue {
    AMQPValue::LongLongInt(term)
}

/// A count as Chime writes it (`x-chime-headers-dropped`).
pub fn count_value(count: u32) -> AMQPValue {
    AMQPValue::LongUInt(count)
}

/// A text as Chime writes it (`x-chime-dead-reason`, `x-chime-error`, …): a long string of at
/// most [`crate::limits::MAX_HEADER_VALUE_BYTES`] bytes, cut at a character boundary and marked.
pub fn text_value(value: &str) -> AMQPValue {
    AMQPValue::LongString(cap_header_value(value).as_ref().into())
}

/// The headers of a trigger the scheduler publishes: attempt `attempt` under leader `term`, not
/// to start before `not_before` (the run's scheduled instant).
pub fn trigger_headers(attempt: u32, term: i64, not_before: DateTime<Utc>) -> FieldTable {
    let mut headers = FieldTable::default();
    headers.insert(HEADER_ATTEMPT.into(), attempt_value(attempt));
    headers.insert(HEADER_TERM.into(), term_value(term));
    headers.insert(HEADER_NOT_BEFORE.into(), instant_value(not_before));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_HEADER_VALUE_BYTES;
    use crate::wire::Trigger;

    /// The headers of a v1 trigger exactly as the scheduler wrote them before the protocol had a
    /// crate of its own (`LongUInt` attempt, `LongLongInt` term and not-before), with the v1
    /// body: both still decode, and the scheduler still writes the same values.
    #[test]
    fn a_v1_trigger_written_before_the_protocol_crate_is_still_read() {
        let mut old = FieldTable::default();
        old.insert("x-chime-attempt".into(), AMQPValue::LongUInt(1));
        old.insert("x-chime-term".into(), AMQPValue::LongLongInt(7));
        old.insert(
            "x-chime-not-before".into(),
            AMQPValue::LongLongInt(1_796_083_200_000),
        );
        let body = crate::wire::V1_BODY;
        let trigger = Trigger::from_body(body.as_bytes()).unwrap();
        assert_eq!(get_integer(Some(&old), HEADER_ATTEMPT), Ok(Some(1)));
        assert_eq!(get_integer(Some(&old), HEADER_TERM), Ok(Some(7)));
        assert_eq!(
            get_instant(Some(&old), HEADER_NOT_BEFORE),
            Some(trigger.scheduled_at)
        );
        assert_eq!(trigger_headers(1, 7, trigger.scheduled_at), old);
    }

    #[test]
    fn integers_are_read_whatever_type_the_publisher_chose() {
        let table = [
            (AMQPValue::ShortShortInt(-3), Some(-3)),
            (AMQPValue::ShortShortUInt(3), Some(3)),
            (AMQPValue::ShortInt(300), Some(300)),
            (AMQPValue::ShortUInt(300), Some(300)),
            (AMQPValue::LongInt(-70_000), Some(-70_000)),
            (AMQPValue::LongUInt(70_000), Some(70_000)),
            (AMQPValue::LongLongInt(i64::MIN), Some(i64::MIN)),
            (AMQPValue::Timestamp(42), Some(42)),
            (AMQPValue::Timestamp(u64::MAX), None),
            (AMQPValue::LongString("123".into()), Some(123)),
            (AMQPValue::ShortString("-5".into()), Some(-5)),
            (AMQPValue::LongString(" 123".into()), None),
            (AMQPValue::LongString("12x".into()), None),
            (AMQPValue::Boolean(true), None),
            (AMQPValue::Double(1.0), None),
        ];
        for (value, want) in table {
            assert_eq!(integer(&value), want, "{value:?}");
        }
        let mut headers = FieldTable::default();
        headers.insert("n".into(), AMQPValue::Boolean(false));
        assert_eq!(get_integer(Some(&headers), "n"), Err(NotAnInteger));
        assert_eq!(get_integer(Some(&headers), "missing"), Ok(None));
        assert_eq!(get_integer(None, "n"), Ok(None));
    }

    #[test]
    fn texts_are_written_bounded() {
        let long = "é".repeat(MAX_HEADER_VALUE_BYTES);
        let AMQPValue::LongString(written) = text_value(&long) else {
            panic!("a text is a long string");
        };
        assert!(written.as_bytes().len() <= MAX_HEADER_VALUE_BYTES);
        assert_eq!(
            text(&AMQPValue::LongString("why".into())).as_deref(),
            Some("why")
        );
        assert_eq!(text(&AMQPValue::LongUInt(1)), None);
    }
}
