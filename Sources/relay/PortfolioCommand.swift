import ArgumentParser
import Foundation
import Portfolio
import PortfolioData

struct PortfolioCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "portfolio",
        abstract: "Manage the portfolio sidecar's data.",
        subcommands: [Import.self]
    )

    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import brokerage transactions from CSV (account,date,kind,symbol,quantity,price,fees).")

        @Argument(help: "The CSV file.") var file: String
        @Option(name: .customLong("data-dir"), help: "Where the portfolio database lives.") var dataDirectory: String = "./data"
        @Option(help: "Currency of accounts the import creates.") var currency: String = "USD"
        @Flag(name: .customLong("if-empty"), help: "Import only when the portfolio has no accounts yet.") var ifEmpty = false
        @Option(help: "Accounts the portfolio holds at most (as portfolio.maxAccounts).") var maxAccounts = PortfolioLimits().accounts
        @Option(help: "Transactions an account holds at most (as portfolio.maxTransactionsPerAccount).")
        var maxTransactionsPerAccount = PortfolioLimits().transactionsPerAccount
        @Option(help: "Distinct symbols the transactions name at most (as portfolio.maxSymbols).") var maxSymbols = PortfolioLimits().symbols

        /// The largest file one import reads (it is held whole, and its rows some five times over).
        static let maxFileBytes = 1 << 30

        /// The file, read whole (the import is one transaction, all or nothing): a regular file (a link
        /// to one is followed), never a device or a pipe read until memory runs out, and no more than
        /// ``maxFileBytes`` of it, read from the one descriptor checked.
        static func read(_ file: String) throws -> String {
            let descriptor = open(file, O_RDONLY | O_NONBLOCK)
            guard descriptor >= 0 else { throw StartupError(message: "cannot read \(file)") }
            let handle = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
            var status = stat()
            guard fstat(descriptor, &status) == 0, status.st_mode & S_IFMT == S_IFREG else {
                throw StartupError(message: "\(file) is not a regular file one can read")
            }
            guard let data = try? handle.read(upToCount: maxFileBytes + 1) ?? Data() else { throw StartupError(message: "cannot read \(file)") }
            guard data.count <= maxFileBytes else {
                throw StartupError(
                    message: "\(file) is past \(maxFileBytes >> 20) MB, what an import reads at most (split it: each part is imported whole or not at all)")
            }
            guard let text = String(data: data, encoding: .utf8) else { throw StartupError(message: "\(file) is not UTF-8 text") }
            return text
        }

        func validate() throws {
            guard maxAccounts > 0, maxTransactionsPerAccount > 0 else { throw ValidationError("--max-accounts and --max-transactions-per-account: above 0") }
            guard (1...PortfolioLimits.maxSymbols).contains(maxSymbols) else { throw ValidationError("--max-symbols: 1 to \(PortfolioLimits.maxSymbols)") }
        }

        func run() async throws {
            // A batch job: it may wait longer for `relay serve`'s short writes than a request would.
            let limits = PortfolioLimits(accounts: maxAccounts, transactionsPerAccount: maxTransactionsPerAccount, symbols: maxSymbols)
            let store = try PortfolioStore(directory: dataDirectory, busyTimeout: 10, limits: limits)
            if ifEmpty, try await !store.accounts().isEmpty {
                print("portfolio already has accounts; nothing imported (\(store.path))")
                return
            }
            let text = try Self.read(file)
            do {
                let rows = try TransactionImport.parse(text)
                let count = try TransactionImport.apply(rows, to: store, currency: currency) { written, total in
                    // On stderr, so a script reading the result line is not disturbed.
                    FileHandle.standardError.write(Data("\(written) of \(total) rows written (committed together at the end)\n".utf8))
                }
                print("imported \(count) transactions into \(store.path)")
            } catch let error as TransactionImport.LineError {
                throw StartupError(message: "\(file): \(error)")
            }
        }
    }
}
