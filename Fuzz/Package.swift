// swift-tools-version:6.1
// libFuzzer targets for the parts that read untrusted bytes: the upstream frame parser, the server side
// of the protocol (every client message) and topic parsing, and Alpaca's frames and server session. A package of its own, built only by
// scripts/fuzz with -sanitize=fuzzer,address (libFuzzer supplies `main`, so these cannot be ordinary
// executables of the relay's package). Run: scripts/fuzz [seconds]
import PackageDescription

let fuzzFlags: [SwiftSetting] = [.unsafeFlags(["-parse-as-library"])]

let package = Package(
    name: "relay-fuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "relay", path: ".."),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
    ],
    targets: [
        .target(name: "FuzzSupport", path: "FuzzSupport"),
        .executableTarget(
            name: "FuzzFrameParser",
            dependencies: ["FuzzSupport", .product(name: "PolygonWire", package: "relay"), .product(name: "NIOCore", package: "swift-nio")],
            path: "FuzzFrameParser", swiftSettings: fuzzFlags),
        .executableTarget(
            name: "FuzzServerSession",
            dependencies: ["FuzzSupport", .product(name: "PolygonWire", package: "relay"), .product(name: "NIOCore", package: "swift-nio")],
            path: "FuzzServerSession", swiftSettings: fuzzFlags),
        .executableTarget(
            name: "FuzzAlpacaFrame",
            dependencies: ["FuzzSupport", .product(name: "AlpacaWire", package: "relay")],
            path: "FuzzAlpacaFrame", swiftSettings: fuzzFlags),
        .executableTarget(
            name: "FuzzAlpacaSession",
            dependencies: ["FuzzSupport", .product(name: "AlpacaWire", package: "relay"), .product(name: "PolygonWire", package: "relay")],
            path: "FuzzAlpacaSession", swiftSettings: fuzzFlags),
        .executableTarget(
            name: "FuzzAlpacaClientSession",
            dependencies: ["FuzzSupport", .product(name: "AlpacaWire", package: "relay"), .product(name: "PolygonWire", package: "relay")],
            path: "FuzzAlpacaClientSession", swiftSettings: fuzzFlags),
        .executableTarget(
            name: "FuzzTopics",
            dependencies: ["FuzzSupport", .product(name: "PolygonWire", package: "relay")],
            path: "FuzzTopics", swiftSettings: fuzzFlags),
    ]
)
