#if canImport(Glibc)
    import Glibc
#endif
import Foundation

/// A plain blocking TCP socket on loopback, for clients that misbehave on purpose (never read, send a
/// header a byte at a time, pipeline frames): what a WebSocket library would not let a test do.
/// Every call is bounded by the socket's send and receive timeouts.
final class RawSocket {
    private(set) var fd: Int32

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Connects to 127.0.0.1:`port`; `receiveBuffer` shrinks the socket's receive buffer first.
    init(port: Int, receiveBuffer: Int? = nil, timeout: Duration = .seconds(5)) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: \(errno)") }
        if var size = receiveBuffer.map(Int32.init) {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        setTimeout(timeout)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = in_addr_t(UInt32(0x7F00_0001).bigEndian)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(fd)
            throw Failure(description: "connect: \(errno)")
        }
    }

    deinit { if fd >= 0 { close(fd) } }

    /// Breaks the connection with a reset: nothing more it was sent is acknowledged (a shutdown of the
    /// receiving side may still acknowledge, and drop, what arrives after it).
    func reset() {
        guard fd >= 0 else { return }
        var immediately = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &immediately, socklen_t(MemoryLayout<linger>.size))
        close(fd)
        fd = -1
    }

    func setTimeout(_ timeout: Duration) {
        var value = timeval(tv_sec: Int(timeout.components.seconds), tv_usec: Int(timeout.components.attoseconds / 1_000_000_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &value, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &value, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Sends what the kernel takes within the send timeout; returns how many bytes that was.
    @discardableResult
    func send(_ bytes: [UInt8]) -> Int {
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { break }
            sent += n
        }
        return sent
    }

    @discardableResult
    func send(_ text: String) -> Int { send(Array(text.utf8)) }

    /// Reads what is there (waiting up to the receive timeout); empty at EOF, `nil` on a time-out or error.
    func receive(max: Int = 65536) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: max)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, max, 0) }
        if n < 0 { return nil }
        return Array(buffer[0..<n])
    }

    /// Everything it reads (as text) until the peer ends its side (`true`) or `timeout` passes or the
    /// connection fails (`false`).
    func readAll(within timeout: Duration) -> (String, Bool) {
        let deadline = ContinuousClock.now + timeout
        setTimeout(.milliseconds(200))
        var received: [UInt8] = []
        while ContinuousClock.now < deadline {
            if let bytes = receive() {
                if bytes.isEmpty { return (String(decoding: received, as: UTF8.self), true) }
                received += bytes
            } else if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                break
            }
        }
        return (String(decoding: received, as: UTF8.self), false)
    }

    /// Reads until the peer closes (true) or `timeout` passes without it (false).
    func readsToEOF(within timeout: Duration) -> Bool {
        let deadline = ContinuousClock.now + timeout
        setTimeout(.milliseconds(200))
        while ContinuousClock.now < deadline {
            if let bytes = receive() {
                if bytes.isEmpty { return true }
            } else if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                return true  // reset
            }
        }
        return false
    }

    /// Reads the byte stream, a small chunk at a time, until `needle` is in it (true), EOF or the
    /// timeout: unlike `readUntil`, it can stop in the middle of a frame, so what the kernel has
    /// acknowledged ends within a few kilobytes (the receive buffer) of the needle.
    func readPartway(to needle: String, timeout: Duration = .seconds(10)) -> Bool {
        let target = Array(needle.utf8)
        var received: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        setTimeout(.milliseconds(200))
        while ContinuousClock.now < deadline {
            if let bytes = receive(max: 512) {
                if bytes.isEmpty { return false }
                received += bytes
                if received.firstRange(of: target) != nil { return true }
            } else if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                return false
            }
        }
        return false
    }

    /// The HTTP request that asks for a WebSocket at `path`.
    static func upgradeRequest(path: String = "/stocks") -> [UInt8] {
        Array(
            ("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8)
    }

    /// Upgrades to a WebSocket at `path`; returns the bytes that came after the response head.
    func upgrade(path: String = "/stocks", then pipelined: [UInt8] = []) throws -> [UInt8] {
        _ = send(Self.upgradeRequest(path: path) + pipelined)
        var received: [UInt8] = []
        let end = Array("\r\n\r\n".utf8)
        while true {
            guard let bytes = receive(), !bytes.isEmpty else { throw Failure(description: "no upgrade response") }
            received += bytes
            if let range = received.firstRange(of: end) {
                let head = String(decoding: received[..<range.lowerBound], as: UTF8.self)
                guard head.hasPrefix("HTTP/1.1 101") else { throw Failure(description: "upgrade refused: \(head)") }
                return Array(received[range.upperBound...])
            }
        }
    }

    /// One masked client frame.
    static func frame(opcode: UInt8, payload: [UInt8], fin: Bool = true) -> [UInt8] {
        var frame: [UInt8] = [(fin ? 0x80 : 0) | opcode]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else if payload.count < 65536 {
            frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            frame.append(0x80 | 127)
            for shift in stride(from: 56, through: 0, by: -8) { frame.append(UInt8((payload.count >> shift) & 0xFF)) }
        }
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        return frame
    }

    static func text(_ text: String) -> [UInt8] { frame(opcode: 0x1, payload: Array(text.utf8)) }

    /// Reads server frames until one whose text contains `needle` (true), a close frame, EOF or the timeout.
    /// Returns the close code when a close frame came instead.
    func readUntil(_ needle: String, timeout: Duration = .seconds(10), initial: [UInt8] = []) -> (found: Bool, closeCode: Int?) {
        var buffer = initial
        let deadline = ContinuousClock.now + timeout
        setTimeout(.milliseconds(200))
        while true {
            // Whole frames in the buffer (server frames are unmasked).
            while buffer.count >= 2 {
                let opcode = buffer[0] & 0x0F
                var length = Int(buffer[1] & 0x7F)
                var offset = 2
                if length == 126 {
                    guard buffer.count >= 4 else { break }
                    length = Int(buffer[2]) << 8 | Int(buffer[3])
                    offset = 4
                } else if length == 127 {
                    guard buffer.count >= 10 else { break }
                    length = buffer[2..<10].reduce(0) { $0 << 8 | Int($1) }
                    offset = 10
                }
                guard buffer.count >= offset + length else { break }
                let payload = Array(buffer[offset..<offset + length])
                buffer.removeFirst(offset + length)
                if opcode == 0x8 {
                    return (false, payload.count >= 2 ? Int(payload[0]) << 8 | Int(payload[1]) : nil)
                }
                if String(decoding: payload, as: UTF8.self).contains(needle) { return (true, nil) }
            }
            guard ContinuousClock.now < deadline else { return (false, nil) }
            if let bytes = receive() {
                if bytes.isEmpty { return (false, nil) }
                buffer += bytes
            }
        }
    }
}
