import Logging
import Testing

@testable import Cluster

/// A connection to the nats-server at `url`, once connected (within 10 s, else the test fails).
func connectedNATS(_ url: String, name: String) async throws -> NATSConnection {
    let connection = NATSConnection(servers: [url], name: name, logger: Logger(label: name))
    let deadline = ContinuousClock.now + .seconds(10)
    while connection.state != .connected {
        try #require(ContinuousClock.now < deadline, "connected to NATS within 10 s")
        try await Task.sleep(for: .milliseconds(20))
    }
    return connection
}
