import ArgumentParser
import Foundation
import Logging
import RelayComposition
import RelayConfiguration

/// `relay replay`: `relay serve` with a recorded day of the tape as every market's source.
struct ReplayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay",
        abstract: "Serve a recorded day from the tape, in the vendor's own protocol at the live paths, so official clients replay unchanged.",
        discussion: """
            Options: --date yyyy-mm-dd (default: the newest day recorded), --markets stocks,crypto (default: every market \
            recorded that day), --speed 1|10|max (default 1; max waits for the first client, then goes as fast as the \
            slowest client reads), --from HH:MM[:SS] and --to HH:MM[:SS] (UTC), --loop (start again at the end: an \
            off-hours test stream). Every other option is a setting of relay serve (--listen, --tape-dir, --client-keys …).
            """
    )

    @Argument(parsing: .captureForPassthrough, help: .init("Options and serve settings, as listed below.", valueName: "options"))
    var arguments: [String] = []

    /// Its own options and the serve settings they are.
    static let options: [String: String] = [
        "--date": "--replay-date", "--markets": "--replay-markets", "--speed": "--replay-speed", "--from": "--replay-from", "--to": "--replay-to",
        "--loop": "--replay-loop",
    ]

    func validate() throws {
        if arguments.contains(where: { $0 == "--help" || $0 == "-h" }) { throw CleanExit.helpRequest(self) }
    }

    /// The arguments as serve settings: its options renamed (`--date=D` too), the newest day when none is named.
    static func serveArguments(_ arguments: [String]) -> [String] {
        var translated = arguments.map { argument in
            let name = argument.split(separator: "=", maxSplits: 1).first.map(String.init) ?? argument
            guard let setting = options[name] else { return argument }
            return setting + argument.dropFirst(name.count)
        }
        if !translated.contains(where: { $0 == "--replay-date" || $0.hasPrefix("--replay-date=") }) { translated += ["--replay-date", "last"] }
        return translated
    }

    func run() async throws {
        var serve = ServeCommand()
        serve.settingArguments = Self.serveArguments(arguments)
        try await serve.run()
    }
}
