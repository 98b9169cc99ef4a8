import NIOCore

/// A first-in first-out queue kept in segments of a fixed size: appending at the back and removing at
/// the front never copy what it already holds (a ring that doubles would copy the whole history, hundreds
/// of megabytes at its bound, and stall the hub that long). Random access by position from the front.
///
/// Value type over reference segments; confined to its owner (the hub's history), not `Sendable`.
struct SegmentedQueue<Element>: RandomAccessCollection {
    private final class Segment {
        /// `nil` once removed: a removed element is let go at once, not when its segment is.
        var items: ContiguousArray<Element?> = []

        init(capacity: Int) { items.reserveCapacity(capacity) }
    }

    static var segmentSize: Int { 4096 }

    private var segments = CircularBuffer<Segment>()
    /// Elements of the first segment already removed.
    private var head = 0
    private(set) var count = 0

    init() {}

    var startIndex: Int { 0 }
    var endIndex: Int { count }

    /// Read and changed in place (`_read`, `_modify`): reading a field of an element does not copy the
    /// element (a history slot holds several references, each a retain and a release to copy).
    subscript(position: Int) -> Element {
        _read {
            let offset = head + position
            // Positions from `head` on hold an element: only a removed one is `nil`.
            yield segments[segments.index(segments.startIndex, offsetBy: offset / Self.segmentSize)].items[offset % Self.segmentSize]!
        }
        nonmutating _modify {
            let offset = head + position
            yield &segments[segments.index(segments.startIndex, offsetBy: offset / Self.segmentSize)].items[offset % Self.segmentSize]!
        }
    }

    mutating func append(_ element: Element) {
        if segments.last.map({ $0.items.count == Self.segmentSize }) ?? true {
            segments.append(Segment(capacity: Self.segmentSize))
        }
        segments.last?.items.append(element)
        count += 1
    }

    /// Removes and returns the first element (the queue is not empty).
    @discardableResult
    mutating func removeFirst() -> Element {
        let segment = segments[segments.startIndex]
        // Moved out, not copied: the segment holds it no longer.
        let first = segment.items[head].take()
        head += 1
        count -= 1
        if head == segment.items.count {
            segments.removeFirst()
            head = 0
        }
        guard let first else { preconditionFailure("SegmentedQueue.removeFirst on an empty queue") }
        return first
    }
}
