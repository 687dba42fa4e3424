//! The world's agenda: every future happening, ordered by virtual time and then by the order it was
//! scheduled, so two events at the same millisecond always run in the same order for a given seed.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

/// Virtual milliseconds since the start of a simulated run. The world owns the only clock; machines get
/// `now` as an input.
pub type SimMillis = u64;

/// The agenda grew past its bound: a machine or the world schedules without limit, which is a bug the
/// run reports instead of exhausting memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the event queue is full ({len_max} pending events)")]
pub struct QueueFull {
    /// The bound that was hit.
    pub len_max: usize,
}

/// One scheduled happening: its time, its tie-break and where its event waits. Ordered by
/// `(at_ms, seq)`; `seq` is unique, so the order is total and does not depend on the payload. The
/// event itself stays in the queue's slots: the heap moves these 24 bytes as it sifts, not the
/// event (a world event is a few hundred bytes, and moving them was 4% of a sweep).
#[derive(Debug, Clone, Copy)]
struct Scheduled {
    at_ms: SimMillis,
    seq: u64,
    slot: usize,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.at_ms == other.at_ms && self.seq == other.seq
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: reverse so the earliest (time, seq) pops first.
        (other.at_ms, other.seq).cmp(&(self.at_ms, self.seq))
    }
}

/// A bounded priority queue of events keyed by `(time, seq)`. Determinism comes from the tie-break:
/// events scheduled for the same millisecond pop in scheduling order.
///
/// About half of a world's events are scheduled for the millisecond being run (a local message,
/// an answer): those wait in a first-in first-out line beside the heap, in `(time, seq)` order
/// like everything else, and each pop takes the earlier of the line's front and the heap's top.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Scheduled>,
    /// The pending events, each in the slot its entry in `heap` names; `None` is a free slot.
    slots: Vec<Option<E>>,
    /// Free slots, reused before the slots grow.
    free: Vec<usize>,
    /// Events scheduled for the time of the last pop, sorted by `(time, seq)` (a push joins it
    /// only when that keeps it sorted; any other goes to the heap).
    now: VecDeque<(SimMillis, u64, E)>,
    /// The time of the last pop.
    popped_ms: SimMillis,
    seq_next: u64,
    len_max: usize,
}

impl<E> EventQueue<E> {
    /// An empty agenda that refuses to hold more than `len_max` events.
    pub fn new(len_max: usize) -> Self {
        Self {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            now: VecDeque::new(),
            popped_ms: 0,
            seq_next: 0,
            len_max,
        }
    }

    /// Schedules `event` at `at_ms`; returns the sequence number that breaks ties.
    ///
    /// # Errors
    /// [`QueueFull`] when `len_max` events are already pending.
    pub fn push(&mut self, at_ms: SimMillis, event: E) -> Result<u64, QueueFull> {
        if self.len() >= self.len_max {
            return Err(QueueFull {
                len_max: self.len_max,
            });
        }
        let seq = self.seq_next;
        self.seq_next += 1;
        // `seq` is above every pending one, so the line stays sorted if `at_ms` is not below
        // its back's.
        if at_ms == self.popped_ms && self.now.back().is_none_or(|(at, ..)| *at <= at_ms) {
            self.now.push_back((at_ms, seq, event));
            return Ok(seq);
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(event);
                slot
            }
            None => {
                self.slots.push(Some(event));
                self.slots.len() - 1
            }
        };
        self.heap.push(Scheduled { at_ms, seq, slot });
        Ok(seq)
    }

    /// Removes and returns the earliest event with its time.
    pub fn pop(&mut self) -> Option<(SimMillis, E)> {
        let line_first = match (self.now.front(), self.heap.peek()) {
            (Some(_), None) => true,
            (Some((at, seq, _)), Some(top)) => (*at, *seq) < (top.at_ms, top.seq),
            (None, _) => false,
        };
        let (at_ms, event) = if line_first {
            let (at_ms, _, event) = self.now.pop_front()?;
            (at_ms, event)
        } else {
            // Every entry of the heap names a filled slot (push fills it, pop and retain empty
            // it as they remove the entry).
            let next = self.heap.pop()?;
            let event = self.slots.get_mut(next.slot)?.take()?;
            self.free.push(next.slot);
            (next.at_ms, event)
        };
        self.popped_ms = at_ms;
        Some((at_ms, event))
    }

    /// The time of the earliest pending event.
    pub fn peek_time(&self) -> Option<SimMillis> {
        let line = self.now.front().map(|(at, ..)| *at);
        let heap = self.heap.peek().map(|s| s.at_ms);
        match (line, heap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Pending events.
    pub fn len(&self) -> usize {
        self.heap.len() + self.now.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty() && self.now.is_empty()
    }

    /// Drops every pending event that `keep` rejects (a crashed node's timers, for instance). Order of
    /// the survivors is unchanged because it lives in `(at_ms, seq)`, not in the heap's layout.
    pub fn retain(&mut self, mut keep: impl FnMut(&E) -> bool) {
        let (slots, free) = (&mut self.slots, &mut self.free);
        self.heap.retain(|s| {
            let kept = slots[s.slot].as_ref().is_some_and(&mut keep);
            if !kept {
                slots[s.slot] = None;
                free.push(s.slot);
            }
            kept
        });
        self.now.retain(|(_, _, e)| keep(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_by_time_then_by_scheduling_order() {
        let mut q = EventQueue::new(16);
        q.push(5, "c").unwrap();
        q.push(1, "a").unwrap();
        q.push(5, "d").unwrap();
        q.push(1, "b").unwrap();
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(1, "a"), (1, "b"), (5, "c"), (5, "d")]);
    }

    #[test]
    fn refuses_past_its_bound() {
        let mut q = EventQueue::new(1);
        q.push(0, ()).unwrap();
        assert_eq!(q.push(0, ()), Err(QueueFull { len_max: 1 }));
    }

    #[test]
    fn retain_keeps_order() {
        let mut q = EventQueue::new(16);
        for i in 0..6u32 {
            q.push(u64::from(i % 2), i).unwrap();
        }
        q.retain(|e| *e != 2);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(order, vec![0, 4, 1, 3, 5]);
    }

    /// Pushes, pops and retains interleaved, slots reused, many pushes at the time of the last
    /// pop (the line beside the heap) and some before it: the queue pops what a sorted list of
    /// `(time, scheduling order)` says, event by event.
    #[test]
    fn reused_slots_pop_in_the_order_of_a_sorted_reference() {
        let mut q = EventQueue::new(1024);
        let mut reference: Vec<(u64, u64, u32)> = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut seq = 0;
        let mut last_popped = 0;
        for i in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 9 {
                0..=2 | 7 => {
                    let at = if x % 9 == 7 { last_popped } else { x % 50 };
                    q.push(at, i).unwrap();
                    reference.push((at, seq, i));
                    seq += 1;
                }
                3 => {
                    q.retain(|e| e % 5 != 0);
                    reference.retain(|(_, _, e)| e % 5 != 0);
                }
                _ => {
                    reference.sort_unstable();
                    let want = (!reference.is_empty()).then(|| reference.remove(0));
                    assert_eq!(q.peek_time(), want.map(|(at, _, _)| at));
                    let got = q.pop();
                    assert_eq!(got, want.map(|(at, _, e)| (at, e)));
                    if let Some((at, _)) = got {
                        last_popped = at;
                    }
                }
            }
            assert_eq!(q.len(), reference.len());
            assert_eq!(q.is_empty(), reference.is_empty());
        }
    }

    /// The same, as the world schedules: never before the time of the last pop, mostly at it.
    #[test]
    fn events_at_the_current_time_pop_after_earlier_scheduled_ones_of_that_time() {
        let mut q = EventQueue::new(16);
        q.push(5, "heap first").unwrap();
        q.push(0, "start").unwrap();
        assert_eq!(q.pop(), Some((0, "start")));
        q.push(5, "heap second").unwrap();
        assert_eq!(q.pop(), Some((5, "heap first")));
        // Now at 5: a push at 5 joins the line, after the heap's event of the same time.
        q.push(5, "line").unwrap();
        q.push(6, "later").unwrap();
        assert_eq!(q.pop(), Some((5, "heap second")));
        assert_eq!(q.pop(), Some((5, "line")));
        assert_eq!(q.pop(), Some((6, "later")));
        assert_eq!(q.pop(), None);
    }
}
