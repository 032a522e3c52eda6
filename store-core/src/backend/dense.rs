//! Positions, cursor checks and gap checks shared by backends whose streams
//! are numbered densely (1, 2, 3, ... with no holes): memory, SQLite,
//! PostgreSQL and sled.
//!
//! # Positions: incarnation and sequence
//!
//! A dense backend's event sits at `Position { major: incarnation, minor:
//! seq }`, spelled `<incarnation>-<seq>` in the event id:
//!
//! * `seq` counts the stream's events from 1. It never goes back while the
//!   stream exists, whatever retention removes.
//! * `incarnation` names one life of the stream. When a stream is gone for
//!   good (deleted, or expired whole) and an event is later appended under
//!   the same stream id, the stream starts again at `seq` 1 under a **new
//!   incarnation**, drawn from a counter the backend keeps for the whole
//!   store and never hands out twice (a database sequence, a counter row, a
//!   sled id). So no event id is ever issued twice in the lifetime of a store
//!   (C2), and an old cursor can never land in the new life of its stream: it
//!   names an incarnation the stream no longer has, which is
//!   [`Error::UnknownEventId`] (C5). The state kept for this is one counter
//!   per store, not a tombstone per deleted stream, so it stays bounded (C8).
//!
//! Incarnations start at 1 and sequence numbers at 1, so a position with a
//! zero part (`v1.<token>.0`, or `<incarnation>-0`, spelled `<incarnation>`)
//! was never issued.
//!
//! # Gaps
//!
//! Retention only ever removes a stream's oldest events, so with dense
//! numbering a gap is visible from numbers alone: if the first retained event
//! after a cursor is not the cursor's direct successor, something in between
//! was purged (C5).
//!
//! This module is for backend authors; applications never need it.

use crate::error::{Error, Result};
use crate::id::{EventId, Position};

/// The position of event `seq` (from 1) of a stream's incarnation
/// `incarnation` (from 1).
///
/// ```
/// use mcp_event_store_core::backend::dense;
///
/// let position = dense::position(3, 42);
/// assert_eq!(position.to_string(), "3-2a");
/// assert_eq!(dense::parts(position), Some((3, 42)));
/// ```
pub const fn position(incarnation: u64, seq: u64) -> Position {
    Position {
        major: incarnation,
        minor: seq,
    }
}

/// The `(incarnation, seq)` of a position a dense backend may have issued,
/// or `None` when no dense backend ever issues it (a zero part).
pub fn parts(position: Position) -> Option<(u64, u64)> {
    (position.major != 0 && position.minor != 0).then_some((position.major, position.minor))
}

/// The `(incarnation, seq)` of a cursor received as `raw`, or
/// [`Error::UnknownEventId`] when no dense backend ever issues it.
pub fn cursor_parts(raw: &str, position: Position) -> Result<(u64, u64)> {
    parts(position).ok_or_else(|| Error::unknown_event_id(raw))
}

/// The state of a stream that a replay cursor is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseStream {
    /// The stream's current incarnation.
    pub incarnation: u64,
    /// The newest sequence number ever assigned in this incarnation.
    pub last_seq: u64,
    /// The oldest sequence number still retained, if any event is.
    pub first_retained: Option<u64>,
}

impl DenseStream {
    /// Whether event `position` of this stream is retained: what a lookup
    /// (C4) answers.
    pub fn retains(&self, position: Position) -> bool {
        match (parts(position), self.first_retained) {
            (Some((incarnation, seq)), Some(first)) => {
                incarnation == self.incarnation && (first..=self.last_seq).contains(&seq)
            }
            _ => false,
        }
    }
}

/// Checks that replay may start after `cursor` (as received: `raw`), given
/// the state of the cursor's stream, and returns the sequence number to
/// read after. A purged cursor whose successors are all still retained is
/// fine: nothing would be missing.
///
/// * a zero part, another incarnation (an earlier life of the stream, or a
///   forgery), or a sequence number beyond the newest: never issued in this
///   life of the stream, [`Error::UnknownEventId`];
/// * a cursor whose direct successor is no longer retained:
///   [`Error::EventsPurged`].
pub fn check_cursor(raw: &str, cursor: &EventId, stream: DenseStream) -> Result<u64> {
    let (incarnation, after) = cursor_parts(raw, cursor.position)?;
    if incarnation != stream.incarnation || after > stream.last_seq {
        return Err(Error::unknown_event_id(raw));
    }
    let next_retained = stream.first_retained.unwrap_or(stream.last_seq + 1);
    if next_retained > after + 1 {
        return Err(Error::events_purged(raw));
    }
    Ok(after)
}

/// Checks that a page read after sequence number `after` starts right after
/// it. `first` is the first sequence number in the page; `None` for an empty
/// page. `last_seq` is the stream's newest sequence as read *with or after*
/// the page (or `None` if the stream is gone or is another incarnation), so
/// an empty page can tell "nothing new" from "everything after the cursor
/// was purged".
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

    fn id(incarnation: u64, seq: u64) -> EventId {
        EventId::new(
            StreamKey::generate().unwrap().token("s"),
            position(incarnation, seq),
        )
    }

    #[test]
    fn positions_sort_by_incarnation_then_sequence() {
        assert!(position(1, u64::MAX) < position(2, 1));
        assert!(position(2, 1) < position(2, 2));
        assert_eq!(parts(position(0, 1)), None);
        assert_eq!(parts(position(1, 0)), None);
        assert_eq!(parts(Position::ZERO), None);
    }

    #[test]
    fn cursor_checks() {
        let full = DenseStream {
            incarnation: 7,
            last_seq: 10,
            first_retained: Some(1),
        };
        assert_eq!(check_cursor("x", &id(7, 1), full).unwrap(), 1);
        assert_eq!(check_cursor("x", &id(7, 10), full).unwrap(), 10);
        for never in [id(7, 0), id(7, 11), id(6, 5), id(8, 5), id(0, 5)] {
            assert!(
                matches!(
                    check_cursor("x", &never, full),
                    Err(Error::UnknownEventId { .. })
                ),
                "{never}"
            );
        }
        let trimmed = DenseStream {
            first_retained: Some(5),
            ..full
        };
        assert!(matches!(
            check_cursor("x", &id(7, 3), trimmed),
            Err(Error::EventsPurged { .. })
        ));
        assert_eq!(check_cursor("x", &id(7, 4), trimmed).unwrap(), 4);
        let empty = DenseStream {
            first_retained: None,
            ..full
        };
        assert_eq!(check_cursor("x", &id(7, 10), empty).unwrap(), 10);
        assert!(matches!(
            check_cursor("x", &id(7, 9), empty),
            Err(Error::EventsPurged { .. })
        ));
    }

    #[test]
    fn lookups_answer_only_for_retained_events_of_this_incarnation() {
        let stream = DenseStream {
            incarnation: 2,
            last_seq: 10,
            first_retained: Some(4),
        };
        assert!(stream.retains(position(2, 4)));
        assert!(stream.retains(position(2, 10)));
        assert!(!stream.retains(position(2, 3)));
        assert!(!stream.retains(position(2, 11)));
        assert!(!stream.retains(position(1, 5)));
        assert!(!stream.retains(position(2, 0)));
        let empty = DenseStream {
            first_retained: None,
            ..stream
        };
        assert!(!empty.retains(position(2, 10)));
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
