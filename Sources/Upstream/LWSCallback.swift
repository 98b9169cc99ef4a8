import CLibWebSockets

/// The C entry point libwebsockets calls for every event of the relay's client protocol.
///
/// A plain global function so Swift can hand it to C as `@convention(c)` (a closure written in
/// `main.swift` would be main-actor isolated and trap). It reaches its Swift owner through the context's
/// user pointer, which holds an unretained ``LWSConnection``: the service thread keeps that object alive
/// until after `lws_context_destroy`, so the pointer is valid for every callback.
func relayLWSCallback(
    _ wsi: OpaquePointer?,
    _ reason: lws_callback_reasons,
    _ user: UnsafeMutableRawPointer?,
    _ input: UnsafeMutableRawPointer?,
    _ length: Int
) -> Int32 {
    guard let wsi, let context = lws_get_context(wsi), let owner = lws_context_user(context) else {
        return 0
    }
    let connection = Unmanaged<LWSConnection>.fromOpaque(owner).takeUnretainedValue()
    return connection.handle(wsi: wsi, reason: reason, input: input, length: length)
}

/// The deadline timer's entry point (see ``LWSConnection/deadlineReached()``), on the service thread.
/// The timer's owner pointer is an unretained ``LWSConnection``, valid for the reason given above: the
/// timer is cancelled before the context is destroyed.
func relayLWSDeadlineCallback(_ sul: UnsafeMutablePointer<lws_sorted_usec_list_t>?) {
    guard let sul, let owner = relay_lws_timer_owner(sul) else { return }
    Unmanaged<LWSConnection>.fromOpaque(owner).takeUnretainedValue().deadlineReached()
}

/// The opening timer's entry point (see ``LWSConnection/connectDeadlineReached()``), as the deadline's.
func relayLWSOpeningCallback(_ sul: UnsafeMutablePointer<lws_sorted_usec_list_t>?) {
    guard let sul, let owner = relay_lws_timer_owner(sul) else { return }
    Unmanaged<LWSConnection>.fromOpaque(owner).takeUnretainedValue().connectDeadlineReached()
}

/// Routes lws's own error and warning lines into swift-log.
func relayLWSLog(_ level: Int32, _ line: UnsafePointer<CChar>?) {
    guard let line else { return }
    var text = String(cString: line)
    while text.last == "\n" { text.removeLast() }
    if level & Int32(LLL_ERR) != 0 {
        lwsLogger.error("\(text)")
    } else {
        lwsLogger.warning("\(text)")
    }
}
