import NIOCore

/// A first-in first-out queue kept in segments of a fixed size: appending at the back and removing at
/// the front never copy what it already holds (a ring that doubles would copy the whole history, hundreds
/// of megabytes at its bound, and stall the hub that long). Random access by position from the front.
///
/// Value type over reference segments; confined to its owner (the hub's history), not `Sendable`.
struct SegmentedQueue<Element>: RandomAccessCollection {
    private final class Segment {
        var items: ContiguousArray<Element> = []

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

    subscript(position: Int) -> Element {
        get {
            let offset = head + position
            return segments[segments.index(segments.startIndex, offsetBy: offset / Self.segmentSize)].items[offset % Self.segmentSize]
        }
        nonmutating set {
            let offset = head + position
            segments[segments.index(segments.startIndex, offsetBy: offset / Self.segmentSize)].items[offset % Self.segmentSize] = newValue
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
        let first = self[0]
        head += 1
        count -= 1
        if let segment = segments.first, head == segment.items.count {
            segments.removeFirst()
            head = 0
        }
        return first
    }
}
