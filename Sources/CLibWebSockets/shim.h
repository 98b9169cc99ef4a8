#ifndef RELAY_LWS_SHIM_H
#define RELAY_LWS_SHIM_H

#include <libwebsockets.h>

/* What Swift cannot import from libwebsockets: LWS_PRE is a macro built from other macros, and the
 * option flags are `long long` macros that import with the wrong signedness. Re-exported here as
 * plain functions with the types the structs use. */

static inline size_t relay_lws_pre(void) { return LWS_PRE; }

static inline uint64_t relay_lws_option_ssl_global_init(void) {
    return (uint64_t)LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
}

static inline int relay_lws_client_flag_use_ssl(void) { return (int)LCCSCF_USE_SSL; }

static inline int relay_lws_client_flag_no_follow_redirect(void) { return (int)LCCSCF_HTTP_NO_FOLLOW_REDIRECT; }

static inline int relay_lws_context_port_no_listen(void) { return CONTEXT_PORT_NO_LISTEN; }

/* lws's own log levels we let through to the relay's logger. */
static inline int relay_lws_log_levels(void) { return LLL_ERR | LLL_WARN; }

/* A timer on the service thread's own scheduler (lws_sul) that knows its Swift owner: the owner
 * pointer sits right after the list element, so the callback, handed the element, finds it. */
struct relay_lws_timer {
    lws_sorted_usec_list_t sul;
    void *owner;
};

static inline void *relay_lws_timer_owner(lws_sorted_usec_list_t *sul) {
    return ((struct relay_lws_timer *)(void *)sul)->owner;
}

static inline lws_sorted_usec_list_t *relay_lws_timer_sul(struct relay_lws_timer *timer) { return &timer->sul; }

static inline int relay_lws_to_kill_sync(void) { return LWS_TO_KILL_SYNC; }

#endif
