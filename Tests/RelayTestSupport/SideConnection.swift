import GRDB

/// A second connection to a SQLite file the code under test holds open, as another process would open
/// it: it waits up to 5 s for the other connection's lock (a write, a checkpoint at close) rather than
/// failing at once with "database is locked".
public func sideConnection(to path: String) throws -> DatabaseQueue {
    var configuration = Configuration()
    configuration.busyMode = .timeout(5)
    return try DatabaseQueue(path: path, configuration: configuration)
}
