import CNats

// libnats entry points. They live in a file of their own (not top-level code) so they are plain C
// functions with no actor isolation; each reaches its Swift owner through the closure pointer it was
// registered with (see NATSConnection for why those objects outlive every callback).

func natsMessageCallback(
    _ connection: OpaquePointer?, _ subscription: OpaquePointer?, _ message: OpaquePointer?, _ closure: UnsafeMutableRawPointer?
) {
    guard let message else { return }
    defer { natsMsg_Destroy(message) }
    guard let closure, let subject = natsMsg_GetSubject(message) else { return }
    let sink = Unmanaged<NATSMessageSink>.fromOpaque(closure).takeUnretainedValue()
    let length = Int(natsMsg_GetDataLength(message))
    let data = natsMsg_GetData(message)
    sink.handler(subject, UnsafeRawBufferPointer(start: data.map(UnsafeRawPointer.init), count: data == nil ? 0 : length))
}

private func owner(_ closure: UnsafeMutableRawPointer?) -> NATSConnection? {
    closure.map { Unmanaged<NATSConnection>.fromOpaque($0).takeUnretainedValue() }
}

func natsConnectedCallback(_ connection: OpaquePointer?, _ closure: UnsafeMutableRawPointer?) {
    owner(closure)?.connected(connection)
}

func natsReconnectedCallback(_ connection: OpaquePointer?, _ closure: UnsafeMutableRawPointer?) {
    owner(closure)?.connected(connection)
}

func natsDisconnectedCallback(_ connection: OpaquePointer?, _ closure: UnsafeMutableRawPointer?) {
    owner(closure)?.disconnected(connection)
}

func natsClosedCallback(_ connection: OpaquePointer?, _ closure: UnsafeMutableRawPointer?) {
    owner(closure)?.closedByLibrary(connection)
}

func natsErrorCallback(
    _ connection: OpaquePointer?, _ subscription: OpaquePointer?, _ status: natsStatus, _ closure: UnsafeMutableRawPointer?
) {
    guard let owner = owner(closure) else { return }
    if status == NATS_SLOW_CONSUMER {
        let handler = owner.onSlowConsumer.withLock { $0 }
        handler?(subscription.flatMap { owner.subscription(for: $0) })
    } else {
        owner.recordError(String(cString: natsStatus_GetText(status)))
    }
}
