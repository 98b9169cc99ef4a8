// swift-tools-version:6.1
// Micro-benchmarks (package-benchmark) for the codec and the hub, kept in a package of their own so the
// relay's own build and CI do not build the benchmark toolchain. Run: scripts/bench-micro
import PackageDescription

let package = Package(
    name: "relay-benchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "relay", path: ".."),
        .package(url: "https://github.com/ordo-one/benchmark.git", from: "1.38.0", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
    ],
    targets: [
        .executableTarget(
            name: "RelayBenchmarks",
            dependencies: [
                .product(name: "PolygonWire", package: "relay"),
                .product(name: "AlpacaWire", package: "relay"),
                .product(name: "MarketDataHub", package: "relay"),
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            path: "RelayBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        )
    ]
)
