// Package queuemodel is a small in-memory reference model of Triage's
// documented queue semantics (README "Concepts"), which checks a history
// of real API calls step by step, in the style of Jepsen's
// queue checkers and porcupine: every answer the system gives is either one
// the documented semantics allow, or a violation (lost, duplicated,
// unexpected, early, out of order, wrong attempts, ...).
//
// # Time and the documented nondeterminism
//
// The system under test runs in the same process, so model and server share
// one clock. A call is observed as a Span (the client's clock before the
// request and after the answer); the server acted at some instant inside it.
// Times the server chose (an enqueue's deliver_after = "now", a nack's
// now + delay) are kept as ranges [lo, hi]. Times the server reports (a
// lease's expiry) are kept exactly.
//
// The model separates two kinds of rule:
//
//   - Strict rules hold at every instant: an item is never delivered before
//     its deliver_after (or while a consumer's lease on it runs), never after
//     it was acked, deleted, dead-lettered or expired, never beyond
//     max_attempts; attempts counts the deliveries that reached a consumer;
//     a stale token changes nothing; dedup keys answer as documented; a
//     response lists each topic's items in (priority, deliver_after, id)
//     order.
//   - Timely rules allow Config.Slack: an item that has been ready for
//     longer than Slack (the dequeuer's recheck interval plus a margin) must
//     be delivered by a dequeue that asks for it, and no less urgent item may
//     be delivered instead of it (no priority inversion).
//
// Where the documented semantics leave an outcome open, the model accepts
// each allowed answer and learns from the one it got (a "possible set" that
// the answer collapses). The open cases are: a lapsed lease's token after a
// later dequeue of the topic (the prefetch may have leased the item again,
// which makes the old token stale); an item out of attempts whose lease
// lapsed (a dequeue moves it to the dead-letter table when it reads it); an
// item past its TTL (deleted by a sweep within Config.SweepSlack); a dedup
// key whose holder may be gone for one of those reasons.
//
// # Using it
//
// Drive the real system, and after each call hand the request, its Span and
// the answer to the matching method (Enqueue, Dequeue, Ack, ...). A non-nil
// error is a violation; its message says what was expected and what came
// back. Helpers (Held, Items, DeadKeys, ...) let a generator pick
// meaningful next operations. Drain at the end checks that nothing
// acknowledged was lost.
package queuemodel
