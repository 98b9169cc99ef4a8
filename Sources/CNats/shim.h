#ifndef RELAY_NATS_SHIM_H
#define RELAY_NATS_SHIM_H

#include <nats/nats.h>

/* The official NATS C client (Debian libnats-dev). Everything the relay uses imports as it is; this
 * shim only names the header, so the module map stays independent of where Debian puts it. */

#endif
