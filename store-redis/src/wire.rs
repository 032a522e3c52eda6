//! Conversions between Redis replies and the core types. Payloads move out of
//! the reply buffers into `Bytes` without a copy.

use bytes::Bytes;
use mcp_event_store_core::backend::{StreamToken, retry_from_millis};
use mcp_event_store_core::{Error, EventId, Position, Result, StoredEvent};
use redis::Value;

/// A Redis entry id (`<ms>-<seq>`) as a position: major = ms, minor = seq.
pub fn parse_entry_id(text: &[u8]) -> Result<Position> {
    let text = std::str::from_utf8(text).map_err(|_| corrupt("entry id is not ASCII"))?;
    let (ms, seq) = text
        .split_once('-')
        .ok_or_else(|| corrupt("entry id without a sequence part"))?;
    match (ms.parse(), seq.parse()) {
        (Ok(major), Ok(minor)) => Ok(Position { major, minor }),
        _ => Err(corrupt("entry id is not <ms>-<seq>")),
    }
}

/// A position as a Redis entry id (an inclusive range bound).
pub fn entry_id(position: Position) -> String {
    format!("{}-{}", position.major, position.minor)
}

/// The same, as an exclusive range start (`(<ms>-<seq>`, Redis 6.2+).
pub fn after(position: Position) -> String {
    format!("({}-{}", position.major, position.minor)
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("unexpected Redis reply: {what}"))
}

fn bytes_of(value: Value) -> Result<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) => Ok(text.into_bytes()),
        _ => Err(corrupt("expected a string")),
    }
}

/// Parses an `XRANGE` reply into events of the stream `token`.
pub fn parse_entries(token: StreamToken, reply: Value) -> Result<Vec<StoredEvent>> {
    let entries = match reply {
        Value::Array(entries) => entries,
        Value::Nil => Vec::new(),
        _ => return Err(corrupt("XRANGE did not return an array")),
    };
    let mut events = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(parts) = entry else {
            return Err(corrupt("stream entry is not an array"));
        };
        let mut parts = parts.into_iter();
        let (Some(id), Some(fields)) = (parts.next(), parts.next()) else {
            return Err(corrupt("stream entry without id and fields"));
        };
        let position = parse_entry_id(&bytes_of(id)?)?;
        let fields = match fields {
            Value::Array(fields) => fields,
            Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            _ => return Err(corrupt("stream entry fields are not an array")),
        };
        let mut data = None;
        let mut retry = None;
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            match bytes_of(name)?.as_slice() {
                b"d" => data = Some(Bytes::from(bytes_of(value)?)),
                b"r" => {
                    let text = bytes_of(value)?;
                    let millis = std::str::from_utf8(&text)
                        .ok()
                        .and_then(|t| t.parse::<i64>().ok())
                        .ok_or_else(|| corrupt("retry hint is not a number"))?;
                    retry = retry_from_millis(Some(millis));
                }
                _ => {}
            }
        }
        events.push(StoredEvent {
            id: EventId::new(token, position),
            data: data.ok_or_else(|| corrupt("stream entry without payload"))?,
            retry,
        });
    }
    Ok(events)
}

/// An optional position stored as an entry id in the metadata hash.
pub fn parse_meta_id(value: Option<&str>) -> Result<Option<Position>> {
    value
        .map(|text| parse_entry_id(text.as_bytes()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_event_store_core::backend::StreamKey;

    #[test]
    fn entry_ids_map_onto_positions() {
        let p = parse_entry_id(b"1700000000000-3").unwrap();
        assert_eq!(
            p,
            Position {
                major: 1_700_000_000_000,
                minor: 3
            }
        );
        assert_eq!(entry_id(p), "1700000000000-3");
        assert_eq!(after(p), "(1700000000000-3");
        assert_eq!(parse_entry_id(b"5-0").unwrap(), Position::seq(5));
        for bad in [&b"5"[..], b"a-1", b"1-", b"-1", b"\xff-1"] {
            assert!(parse_entry_id(bad).is_err());
        }
    }

    #[test]
    fn xrange_replies_parse_without_losing_bytes() {
        let token = StreamKey::generate().unwrap().token("s");
        let entry = |id: &str, fields: Vec<&[u8]>| {
            Value::Array(vec![
                Value::BulkString(id.as_bytes().to_vec()),
                Value::Array(
                    fields
                        .into_iter()
                        .map(|f| Value::BulkString(f.to_vec()))
                        .collect(),
                ),
            ])
        };
        let reply = Value::Array(vec![
            entry("10-0", vec![b"t", b"1", b"d", b"\x00\xff"]),
            entry("10-1", vec![b"t", b"1", b"d", b"", b"r", b"3000"]),
        ]);
        let events = parse_entries(token, reply).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(&events[0].data[..], b"\x00\xff");
        assert_eq!(events[0].retry, None);
        assert_eq!(events[1].id.to_string().rsplit('.').next(), Some("a-1"));
        assert_eq!(
            events[1].retry,
            Some(std::time::Duration::from_millis(3000))
        );
        assert!(parse_entries(token, Value::Array(vec![entry("1-0", vec![b"t", b"1"])])).is_err());
        assert!(parse_entries(token, Value::Int(3)).is_err());
    }
}
