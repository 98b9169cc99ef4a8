import ArgumentParser
import Logging

/// `relay`: argument parsing and wiring only; every command runs library types.
@main
struct RelayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "relay",
        abstract: "One upstream connection per market and vendor account (Polygon/Massive and Alpaca), fanned out to any number of clients speaking the vendor's own protocol.",
        subcommands: [ServeCommand.self, DemoFeedCommand.self, BenchCommand.self, PortfolioCommand.self, TapeCommand.self, ReplayCommand.self],
        defaultSubcommand: ServeCommand.self
    )
}

/// Sets up swift-log once per process: lines to standard error at the chosen level.
func bootstrapLogging(level: Logger.Level) {
    LoggingSystem.bootstrap { label in
        var handler = StreamLogHandler.standardError(label: label)
        handler.logLevel = level
        return LazyMetadataLogHandler(handler)
    }
}

/// A `StreamLogHandler` whose metadata is rendered when a line is written, not each time it is set:
/// Hummingbird sets a request id on every request's logger, and `StreamLogHandler` renders all of a
/// logger's metadata into text on every set (a few percent of a small REST answer's time), for lines
/// that, at the usual levels, are never written. The lines are the same (metadata sorted by key).
struct LazyMetadataLogHandler: LogHandler {
    private var stream: StreamLogHandler
    var metadata: Logger.Metadata = [:]

    init(_ stream: StreamLogHandler) {
        self.stream = stream
    }

    var logLevel: Logger.Level {
        get { stream.logLevel }
        set { stream.logLevel = newValue }
    }

    var metadataProvider: Logger.MetadataProvider? {
        get { stream.metadataProvider }
        set { stream.metadataProvider = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var event = event
        if !metadata.isEmpty {
            // As `StreamLogHandler` merges: the logger's metadata, then the provider's, then the line's own.
            var merged = metadata
            if let provided = metadataProvider?.get() { merged.merge(provided) { _, later in later } }
            if let explicit = event.metadata { merged.merge(explicit) { _, later in later } }
            event.metadata = merged
        }
        stream.log(event: event)
    }
}

/// A setting that stops the relay from starting: printed as `Error: <message>`, exit status 1, without
/// the usage text (the command line itself was fine).
struct StartupError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}
