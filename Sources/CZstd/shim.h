#ifndef RELAY_ZSTD_SHIM_H
#define RELAY_ZSTD_SHIM_H

#include <zstd.h>

/* The system zstd library (Debian libzstd-dev): the tape's blocks are zstd frames. This shim only
 * names the header, so the module map stays independent of where Debian puts it. */

#endif
