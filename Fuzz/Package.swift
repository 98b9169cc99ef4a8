// swift-tools-version:6.1
// libFuzzer targets for the parts that read untrusted bytes: the upstream frame parser, the server side
// of the protocol (every client message) and topic parsing, Alpaca's frames and both sides of its session, and
// the tape's files. A package of its own, built only by
// scripts/fuzz with -sanitize=fuzzer,address (libFuzzer supplies `main`, so these cannot be ordinary
// executables of the relay's package). Run: scripts/fuzz [seconds]
import PackageDescription

let fuzzFlags: [SwiftSetting] = [.unsafeFlags(["-parse-as-library"])]

/// One fuzz target in its folder, on the relay's `products` (and NIOCore when `nio`).
func fuzzTarget(_ name: String, _ products: [String], nio: Bool = false) -> Target {
    .executableTarget(
        name: name,
        dependencies: ["FuzzSupport"] + products.map { .product(name: $0, package: "relay") }
            + (nio ? [.product(name: "NIOCore", package: "swift-nio")] : []),
        path: name, swiftSettings: fuzzFlags)
}

let package = Package(
    name: "relay-fuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "relay", path: ".."),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
    ],
    targets: [
        .target(name: "FuzzSupport", path: "FuzzSupport"),
        fuzzTarget("FuzzFrameParser", ["PolygonWire"], nio: true),
        fuzzTarget("FuzzServerSession", ["PolygonWire"], nio: true),
        fuzzTarget("FuzzAlpacaFrame", ["AlpacaWire"]),
        fuzzTarget("FuzzAlpacaSession", ["AlpacaWire", "PolygonWire"]),
        fuzzTarget("FuzzAlpacaClientSession", ["AlpacaWire", "PolygonWire"]),
        fuzzTarget("FuzzTopics", ["PolygonWire"]),
        fuzzTarget("FuzzTapeReader", ["Tape"]),
    ]
)
