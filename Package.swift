// swift-tools-version:6.1
import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny")
]

/// The modules every delivered event passes through (codec, hub, downstream write path). Their release
/// builds leave out the run-time exclusivity checks: the hot path touches class-held state (the hub's
/// subscribers, NIO's buffers inlined here) for every event, and the checks cost more than the work
/// (6.5% of the relay's CPU in the `fanout` scenario). The compile-time checks and strict concurrency
/// stay; debug builds, and so the test suite, keep the run-time checks too.
let hotPath: [SwiftSetting] = strict + [
    .unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))
]

let package = Package(
    name: "relay",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "relay", targets: ["relay"]),
        // For the micro-benchmarks package under Benchmarks/.
        .library(name: "PolygonWire", targets: ["PolygonWire"]),
        // For the fuzz targets under Fuzz/.
        .library(name: "AlpacaWire", targets: ["AlpacaWire"]),
        .library(name: "MarketDataHub", targets: ["MarketDataHub"]),
        .library(name: "Tape", targets: ["Tape"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.1.0"),
        .package(url: "https://github.com/apple/swift-configuration.git", from: "1.4.0", traits: ["YAML"]),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.8.0"),
        .package(url: "https://github.com/apple/swift-system.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.1.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift.git", from: "0.1.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.0.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket.git", from: "2.8.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.25.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.0"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.29.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.24.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.0.0"),
        .package(url: "https://github.com/jpsim/Yams.git", "5.0.0"..<"7.0.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CLibWebSockets",
            pkgConfig: "libwebsockets",
            providers: [.apt(["libwebsockets-dev", "libssl-dev"])]
        ),
        .systemLibrary(
            name: "CZstd",
            pkgConfig: "libzstd",
            providers: [.apt(["libzstd-dev"])]
        ),
        // The tape: what the relay received, kept on disk in zstd blocks per market per UTC day.
        .target(
            name: "Tape",
            dependencies: [
                "CZstd", "MarketCore", "AsyncSupport", .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Metrics", package: "swift-metrics"), .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // A recorded day of the tape replayed as a market's source.
        .target(
            name: "TapeReplay",
            dependencies: [
                "Tape", "MarketCore", "MarketDataHub", "AsyncSupport", .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"), .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        .systemLibrary(
            name: "CNats",
            pkgConfig: "libnats",
            providers: [.apt(["libnats-dev"])]
        ),
        .target(
            name: "Cluster",
            dependencies: [
                "MarketCore", "MarketREST", "CNats", "MarketDataHub", "Upstream", "AsyncSupport", "Tape",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "Dashboard",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")],
            resources: [.embedInCode("Assets")],
            swiftSettings: strict
        ),
        .target(
            name: "AsyncSupport",
            dependencies: [.product(name: "NIOPosix", package: "swift-nio")],
            swiftSettings: strict
        ),
        // What every vendor shares: the event value, topics, markets, entitlements, limits, positions,
        // frames. It imports no vendor module; each vendor's wire module depends on it and on nothing else of ours.
        .target(
            name: "MarketCore",
            dependencies: [.product(name: "NIOCore", package: "swift-nio"), .product(name: "Logging", package: "swift-log")],
            swiftSettings: hotPath
        ),
        .target(
            name: "PolygonWire",
            dependencies: ["MarketCore", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: hotPath
        ),
        .target(
            name: "AlpacaWire",
            dependencies: ["MarketCore", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: hotPath
        ),
        .target(
            name: "Upstream",
            dependencies: [
                "MarketCore", "CLibWebSockets", "MarketDataHub", "AsyncSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "MarketDataHub",
            dependencies: [
                "MarketCore", "AsyncSupport",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "HeapModule", package: "swift-collections"),
            ],
            swiftSettings: hotPath
        ),
        .target(
            name: "RelayServer",
            dependencies: [
                "MarketCore", "MarketDataHub", "AsyncSupport", "Dashboard", "RESTGateway", "MarketREST",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: hotPath
        ),
        .target(
            name: "DemoFeed",
            dependencies: [
                "PolygonWire", "AlpacaWire", "AsyncSupport",
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // Every setting of `relay serve`, resolved from flags, environment and file (swift-configuration).
        .target(
            name: "RelayConfiguration",
            dependencies: [
                "MarketCore", "MarketREST", "Upstream", "MarketDataHub", "RelayServer", "Cluster", "DemoFeed", "GapFill", "Tape", "TapeReplay",
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: strict
        ),
        // The top of the module graph: the composition root that wires every part into one relay.
        .target(
            name: "RelayComposition",
            dependencies: [
                "RelayConfiguration", "PolygonWire", "AlpacaWire", "AsyncSupport", "Upstream", "MarketDataHub", "RelayServer", "DemoFeed", "Portfolio", "Cluster",
                "PortfolioDomain", "PortfolioData", "PolygonRESTClient", "AlpacaREST", "MarketREST", "RESTGateway", "PortfolioHTTP", "GapFill", "Tape", "TapeReplay",
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // The portfolio sidecar, split the way Hummingbird splits core from framework: the pure domain
        // (money, days, lots, valuation, snapshot and close rules, holdings views), the store (GRDB, CSV
        // import), the Polygon REST client with its request gate, the service (valuation on the hub's
        // stream, snapshots, security details and their cache), and the HTTP surface (routes, JSON).
        .target(
            name: "PortfolioDomain",
            dependencies: ["MarketCore", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: strict
        ),
        .target(
            name: "PortfolioData",
            dependencies: ["PortfolioDomain", "MarketCore", .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: strict
        ),
        // The REST seam: what the relay asks of a vendor's REST API (gap fill's history, the portfolio's
        // reference data), the request gate and pace; no vendor's paths.
        .target(
            name: "MarketREST",
            dependencies: ["MarketCore", "PortfolioDomain", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: strict
        ),
        // The REST gateway: the account's REST API through the relay (live answers, a shared cache, one
        // budget), vendor-neutral; each vendor's REST module gives its dialect.
        .target(
            name: "RESTGateway",
            dependencies: [
                "MarketCore", "MarketREST", .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"), .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"), .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // Alpaca's market-data REST API as the gateway serves it.
        .target(
            name: "AlpacaREST",
            dependencies: ["AlpacaWire", "RESTGateway", "MarketREST", "MarketCore", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: strict
        ),
        .target(
            name: "PolygonRESTClient",
            dependencies: [
                "PortfolioDomain", "PolygonWire", "MarketREST", "MarketCore", "RESTGateway",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // After an upstream outage: what the market did meanwhile, from the REST API, to the topics' holders.
        .target(
            name: "GapFill",
            dependencies: [
                "MarketCore", "MarketDataHub", "MarketREST",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "Portfolio",
            dependencies: [
                "MarketCore", "PortfolioDomain", "PortfolioData", "MarketREST", "MarketDataHub",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "PortfolioHTTP",
            dependencies: [
                "MarketCore", "Portfolio", "PortfolioDomain", "PortfolioData", "MarketREST",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "RelayBench",
            dependencies: [
                "AlpacaWire",
                "PolygonWire", "DemoFeed",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "HummingbirdWSClient", package: "hummingbird-websocket"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "relay",
            dependencies: [
                "RelayComposition", "RelayConfiguration", "AlpacaWire", "DemoFeed", "RelayServer", "RelayBench", "Portfolio", "PortfolioData", "PortfolioDomain", "PolygonRESTClient",
                "PortfolioHTTP", "Tape", "Cluster",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "AlpacaWireTests",
            dependencies: ["AlpacaWire", "MarketCore", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: strict
        ),
        .testTarget(
            // One conformance suite: the same specs against every protocol behind the seam.
            name: "WireProtocolTests",
            dependencies: ["MarketCore", "PolygonWire", "AlpacaWire", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "PolygonWireTests",
            dependencies: [
                "PolygonWire",
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            resources: [.copy("Fixtures")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "GapFillTests",
            dependencies: ["GapFill", "MarketDataHub", "PolygonWire", "PolygonRESTClient", "MarketREST", "MarketCore", "RelayTestSupport"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "MarketDataHubTests",
            dependencies: ["MarketDataHub", "PolygonWire", "AlpacaWire", .product(name: "MetricsTestKit", package: "swift-metrics")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "RelayConfigurationTests",
            dependencies: ["RelayConfiguration", "RelayComposition", "MarketCore", "Upstream", "RelayServer"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "UpstreamTests",
            dependencies: ["Upstream", "PolygonWire", "AlpacaWire"],
            swiftSettings: strict
        ),
        // What several test targets share (a bounded wait for state without a change signal, a tape of quotes).
        .target(
            name: "RelayTestSupport",
            dependencies: ["Tape", .product(name: "GRDB", package: "GRDB.swift")],
            path: "Tests/RelayTestSupport",
            swiftSettings: strict
        ),
        .testTarget(
            name: "AsyncSupportTests",
            dependencies: ["AsyncSupport", "RelayTestSupport", .product(name: "NIOPosix", package: "swift-nio")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "TapeTests",
            dependencies: [
                "Tape", "TapeReplay", "MarketCore", "MarketDataHub", "PolygonWire", "AlpacaWire", "RelayTestSupport", .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"), .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "RelayServerTests",
            dependencies: [
                "RelayServer", "PolygonWire", "RelayTestSupport", .product(name: "NIOEmbedded", package: "swift-nio"), .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ClusterTests",
            dependencies: [
                "Cluster", "PolygonWire", "AlpacaWire", "Tape", "MarketCore", "MarketREST", "RelayBench", "MarketDataHub", "Upstream",
                "RelayTestSupport", .product(name: "Logging", package: "swift-log"), .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "MarketRESTTests",
            dependencies: ["MarketREST", "RelayTestSupport"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "GatewayTests",
            dependencies: [
                "RESTGateway", "PolygonRESTClient", "AlpacaREST", "MarketREST", "MarketCore", .product(name: "NIOCore", package: "swift-nio"),
                "RelayTestSupport", .product(name: "GRDB", package: "GRDB.swift"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "PortfolioTests",
            dependencies: [
                "Portfolio", "PortfolioDomain", "PortfolioData", "PolygonRESTClient", "MarketREST", "PortfolioHTTP", "MarketDataHub", "AlpacaWire",
                "PolygonWire", "RelayTestSupport", .product(name: "GRDB", package: "GRDB.swift"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "RelayComposition", "RelayConfiguration", "RelayServer", "Upstream", "MarketDataHub", "DemoFeed", "PolygonWire", "Portfolio",
                "RelayBench", "Cluster", "AlpacaWire", "Tape",
                "PortfolioDomain", "PortfolioData", "PolygonRESTClient", "MarketREST", "RelayTestSupport",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "HummingbirdWSClient", package: "hummingbird-websocket"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            resources: [.copy("Fixtures")],
            swiftSettings: strict
        ),
    ]
)
