//! Cursor and gap checks shared by backends whose positions are dense
//! per-stream sequence numbers (1, 2, 3, ... with no holes).
//!
//! Retention only ever removes a stream's oldest events, so with dense
//! numbering a gap is visible from numbers alone: if the first retained event
//! after a cursor is not the cursor's direct successor, something in between
//! was purged (C5).

use crate::error::{Error, Result};
use crate::id::{EventId, Position};

/// The state of a stream that a replay cursor is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseStream {
    /// The newest sequence number ever assigned in the stream.
    pub last_seq: u64,
    /// The oldest sequence number still retained, if any event is.
    pub first_retained: Option<u64>,
}

/// Checks that replay may start after `cursor` (as received: `raw`), given
/// the state of the cursor's stream. A purged cursor whose successors are
/// all still retained is fine: nothing would be missing.
pub fn check_cursor(raw: &str, cursor: &EventId, stream: DenseStream) -> Result<u64> {
    let after = dense_seq(raw, cursor.position)?;
    if after > stream.last_seq {
        // Never issued: a forged or foreign id.
        return Err(Error::unknown_event_id(raw));
    }
    let next_retained = stream.first_retained.unwrap_or(stream.last_seq + 1);
    if next_retained > after + 1 {
        return Err(Error::events_purged(raw));
    }
    Ok(after)
}

/// The sequence number of a position on a dense backend; positions with a
/// minor part were never issued by one.
pub fn dense_seq(raw: &str, position: Position) -> Result<u64> {
    if position.minor != 0 {
        return Err(Error::unknown_event_id(raw));
    }
    Ok(position.major)
}

/// Checks that a page read after `after` starts right after it. `first` is
/// the first sequence number in the page; `None` for an empty page.
/// `last_seq` is the stream's newest sequence as read *after* the page (or
/// `None` if the stream is gone), so an empty page can tell "nothing new"
/// from "everything after the cursor was purged".
pub fn check_page(raw: &str, after: u64, first: Option<u64>, last_seq: Option<u64>) -> Result<()> {
    match first {
        Some(first) if first == after + 1 => Ok(()),
        Some(_) => Err(Error::events_purged(raw)),
        None => match last_seq {
            Some(last) if last <= after => Ok(()),
            _ => Err(Error::events_purged(raw)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::StreamKey;

    fn id(seq: u64) -> EventId {
        EventId::new(
            StreamKey::generate().unwrap().token("s"),
            Position::seq(seq),
        )
    }

    #[test]
    fn cursor_checks() {
        let full = DenseStream {
            last_seq: 10,
            first_retained: Some(1),
        };
        assert_eq!(check_cursor("x", &id(0), full).unwrap(), 0);
        assert_eq!(check_cursor("x", &id(10), full).unwrap(), 10);
        assert!(matches!(
            check_cursor("x", &id(11), full),
            Err(Error::UnknownEventId { .. })
        ));
        let trimmed = DenseStream {
            last_seq: 10,
            first_retained: Some(5),
        };
        assert!(matches!(
            check_cursor("x", &id(3), trimmed),
            Err(Error::EventsPurged { .. })
        ));
        assert_eq!(check_cursor("x", &id(4), trimmed).unwrap(), 4);
        let empty = DenseStream {
            last_seq: 10,
            first_retained: None,
        };
        assert_eq!(check_cursor("x", &id(10), empty).unwrap(), 10);
        assert!(matches!(
            check_cursor("x", &id(9), empty),
            Err(Error::EventsPurged { .. })
        ));
        let two_part = EventId::new(id(1).token, Position { major: 1, minor: 1 });
        assert!(matches!(
            check_cursor("x", &two_part, full),
            Err(Error::UnknownEventId { .. })
        ));
    }

    #[test]
    fn page_checks() {
        assert!(check_page("x", 4, Some(5), Some(9)).is_ok());
        assert!(check_page("x", 4, Some(6), Some(9)).is_err());
        assert!(check_page("x", 4, None, Some(4)).is_ok());
        assert!(check_page("x", 4, None, Some(9)).is_err());
        assert!(check_page("x", 4, None, None).is_err());
    }
}
