import Foundation
import Glibc
import RelayBench
import Testing

/// Memory per idle downstream connection, measured on a relay process: a return to a task (or a few)
/// per connection for reading and writing costs tens of KB each, and this test catches it.
@Suite("Idle downstream connections", .serialized)
struct IdleConnectionsTests {
    static let connections = 2_000
    /// Measured about 8 KB per connection (release) / 9 KB (debug) after the NIO downstream; 45 KB
    /// before it. The ceiling leaves room for allocator noise but not for per-connection tasks again.
    static let ceilingBytesPerConnection = 24 * 1024

    @Test("2,000 authenticated, subscribed, idle clients cost less than 24 KB each")
    func idleClientsAreCheap() async throws {
        let relay = RelayProcess(
            binary: RelayProcess.siblingBinary(),
            arguments: ["serve", "--listen", "127.0.0.1:0", "--no-portfolio", "--no-tape", "--demo-rate", "20", "--client-keys", "k"],
            showLogs: false)
        // Both ends of 2,200 connections live on this machine.
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        limit.rlim_cur = limit.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        try #require(limit.rlim_cur > 2 * 2_300, "the descriptor limit (\(limit.rlim_cur)) is too low for this test")
        let port = try await relay.start(timeout: .seconds(30))
        defer { relay.terminate() }

        // Warm up the code paths and the allocator before the baseline.
        var clients = try (0..<200).map { _ in try RawMarketClient(port: port, topic: "Q.AAPL") }
        try await Task.sleep(for: .milliseconds(500))
        let before = relay.residentBytes()
        for index in 0..<Self.connections {
            clients.append(try RawMarketClient(port: port, topic: index % 2 == 0 ? "Q.MSFT" : "T.MSFT"))
        }
        // Everyone was answered "subscribed"; the hub holds them all.
        let expected = clients.count
        try await eventually("the hub counts every client", timeout: .seconds(20)) {
            guard let answer = try? await httpGet("http://127.0.0.1:\(port)/healthz") else { return false }
            return (jsonObject(answer.body)["subscribers"] as? Int) == expected
        }
        let after = relay.residentBytes()
        let perConnection = (after - before) / Self.connections
        print("idle downstream connections: \(perConnection) bytes each (\(before / 1024) KB before, \(after / 1024) KB after \(Self.connections))")
        #expect(perConnection < Self.ceilingBytesPerConnection, "each idle connection costs \(perConnection) bytes")
        #expect(clients.allSatisfy { $0.isOpen() }, "no client was closed")
        for client in clients { client.close() }
    }
}

/// A bare WebSocket client on a blocking POSIX socket: connects, upgrades, authenticates and subscribes,
/// then holds the connection without reading (an idle dashboard). Cheap on the test's side, so the
/// test can hold thousands.
final class RawMarketClient {
    private let fd: Int32

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    init(port: Int, key: String = "k", topic: String) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: \(String(cString: strerror(errno)))") }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            Glibc.close(fd)
            throw Failure(description: "connect: \(String(cString: strerror(errno)))")
        }
        try send(
            Array(
                "GET /stocks HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                    .utf8))
        try read(until: "connected")
        try send(Self.frame(#"{"action":"auth","params":"\#(key)"}"#))
        try read(until: "auth_success")
        try send(Self.frame(#"{"action":"subscribe","params":"\#(topic)"}"#))
        try read(until: "subscribed to")
    }

    /// Whether the relay has not closed the connection (a peek finds no end of stream).
    func isOpen() -> Bool {
        var byte: UInt8 = 0
        let peeked = recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        return peeked > 0 || (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    }

    func close() { Glibc.close(fd) }

    private func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            guard written > 0 else { throw Failure(description: "write: \(String(cString: strerror(errno)))") }
            offset += written
        }
    }

    /// Reads until the bytes received so far contain `marker`.
    private func read(until marker: String) throws {
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !String(decoding: received, as: UTF8.self).contains(marker) {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            guard count > 0 else {
                throw Failure(description: "no \(marker) from the relay; got \(String(decoding: received, as: UTF8.self))")
            }
            received += chunk[0..<count]
        }
    }

    /// A masked client text frame.
    static func frame(_ text: String) -> [UInt8] {
        let payload = Array(text.utf8)
        precondition(payload.count < 126)
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        return [0x81, 0x80 | UInt8(payload.count)] + mask + payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
    }
}
