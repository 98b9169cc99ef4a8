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
        return handler
    }
}

/// A setting that stops the relay from starting: printed as `Error: <message>`, exit status 1, without
/// the usage text (the command line itself was fine).
struct StartupError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}
