// ceiling-relay: the plain C fan-out relay that `scripts/fanbench` measures beside the Swift relay, as
// the ceiling of what this machine can do (the issue's "C epoll relay, one write per subscriber per
// frame, no framework"). It is a measuring stick, not a product: one thread, one epoll, just enough of
// the Polygon conversation for fanbench (connected, auth, subscribe to Q.SYM or Q.*), no TLS, no
// limits beyond a dropped client when its unsent bytes pass 4 MB.
//
//   ceiling-relay --listen PORT --upstream-port PORT
//
// Upstream it subscribes to Q.* once; each upstream message is split into its events (flat JSON
// objects), and each subscriber whose symbols match gets one frame of its events with one write.
// GET /healthz answers {"subscribers":N} (clients past their subscribe), for the idle scenario's
// connect time.
//
// Build: cc -O2 -o ceiling-relay ceiling-relay.c -lcrypto
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_SYMBOLS 65536
#define MAX_PENDING (4 << 20)

typedef struct {
  int fd, state;  // 0 HTTP request, 1 auth, 2 streaming, 9 closed
  unsigned char *in; size_t in_len, in_cap;
  unsigned char *out; size_t out_len, out_cap;  // unsent bytes, when a write came up short
  unsigned char *build; size_t build_len, build_cap;  // this message's events for this client
  int wildcard, touched;
} conn_t;

static conn_t **conns;  // by fd
static int conns_cap;
static int *subs_of[MAX_SYMBOLS], subs_count[MAX_SYMBOLS], subs_cap[MAX_SYMBOLS];  // fds per symbol
static int *wild; static int wild_count, wild_cap;
static int *touched; static int touched_count, touched_cap;
static int streaming, symbols_seen;  // clients past auth; 1 + the highest symbol subscribed
static int ep;

static void grow(unsigned char **p, size_t *cap, size_t need) {
  if (need <= *cap) return;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  *p = realloc(*p, c); *cap = c;
}

static void push_int(int **list, int *count, int *cap, int v) {
  if (*count == *cap) { *cap = *cap ? *cap * 2 : 16; *list = realloc(*list, sizeof(int) * *cap); }
  (*list)[(*count)++] = v;
}

static void drop_int(int *list, int *count, int v) {
  for (int i = 0; i < *count; i++) if (list[i] == v) { list[i] = list[--*count]; return; }
}

static size_t ws_header(unsigned char *h, int opcode, size_t len, int masked) {
  size_t n = 0;
  h[n++] = 0x80 | opcode;
  unsigned char m = masked ? 0x80 : 0;
  if (len < 126) h[n++] = m | (unsigned char)len;
  else if (len < 65536) { h[n++] = m | 126; h[n++] = len >> 8; h[n++] = len & 255; }
  else { h[n++] = m | 127; for (int i = 7; i >= 0; i--) h[n++] = (len >> (8 * i)) & 255; }
  if (masked) { h[n++] = 0; h[n++] = 0; h[n++] = 0; h[n++] = 0; }
  return n;
}

// The header of the whole frame at h (have bytes): its length (mask key included), 0 while the frame is
// incomplete; the payload's length in *len as soon as the header says it.
static size_t frame_header(const unsigned char *h, size_t have, uint64_t *len) {
  *len = 0;
  if (have < 2) return 0;
  size_t hl = 2;
  *len = h[1] & 127;
  if (*len == 126) { if (have < 4) return 0; *len = (h[2] << 8) | h[3]; hl = 4; }
  else if (*len == 127) { if (have < 10) return 0; *len = 0; for (int i = 0; i < 8; i++) *len = (*len << 8) | h[2 + i]; hl = 10; }
  if (h[1] & 0x80) hl += 4;
  return have < hl + *len ? 0 : hl;
}

static int symbol_of(const char *s, size_t n) {  // fanbench's names: S and digits
  if (n < 2 || s[0] != 'S') return -1;
  int v = 0;
  for (size_t i = 1; i < n; i++) { if (s[i] < '0' || s[i] > '9') return -1; v = v * 10 + (s[i] - '0'); }
  return v < MAX_SYMBOLS ? v : -1;
}

static void close_conn(conn_t *c) {
  if (c->state == 9) return;
  if (c->state == 2) {
    streaming--;
    if (c->wildcard) drop_int(wild, &wild_count, c->fd);
    for (int s = 0; s < symbols_seen; s++) if (subs_count[s]) drop_int(subs_of[s], &subs_count[s], c->fd);
  }
  c->state = 9;
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  conns[c->fd] = NULL;
  free(c->in); free(c->out); free(c->build); free(c);
}

// Writes what is pending, then the iovecs; keeps what the socket did not take.
static void send_iov(conn_t *c, struct iovec *iov, int n) {
  size_t total = 0;
  for (int i = 0; i < n; i++) total += iov[i].iov_len;
  ssize_t w = 0;
  if (!c->out_len) {
    w = writev(c->fd, iov, n);
    if (w < 0) { if (errno != EAGAIN) { close_conn(c); return; } w = 0; }
    if ((size_t)w == total) return;
  }
  if (c->out_len + total - w > MAX_PENDING) { close_conn(c); return; }
  size_t skip = (size_t)w;
  for (int i = 0; i < n; i++) {
    if (skip >= iov[i].iov_len) { skip -= iov[i].iov_len; continue; }
    grow(&c->out, &c->out_cap, c->out_len + iov[i].iov_len - skip);
    memcpy(c->out + c->out_len, (char *)iov[i].iov_base + skip, iov[i].iov_len - skip);
    c->out_len += iov[i].iov_len - skip; skip = 0;
  }
  struct epoll_event e = {.events = EPOLLIN | EPOLLOUT, .data.fd = c->fd};
  epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
}

static void send_text(conn_t *c, const char *p, size_t len) {
  unsigned char h[14];
  struct iovec iov[2] = {{h, ws_header(h, 1, len, 0)}, {(void *)p, len}};
  send_iov(c, iov, 2);
}

static void flush_out(conn_t *c) {
  ssize_t w = write(c->fd, c->out, c->out_len);
  if (w < 0) { if (errno != EAGAIN) close_conn(c); return; }
  memmove(c->out, c->out + w, c->out_len - w);
  c->out_len -= w;
  if (!c->out_len) { struct epoll_event e = {.events = EPOLLIN, .data.fd = c->fd}; epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e); }
}

static void subscribe(conn_t *c, const char *p, const char *end) {
  while (p < end) {
    const char *comma = memchr(p, ',', end - p), *tok = comma ? comma : end;
    while (p < tok && *p == ' ') p++;
    const char *dot = memchr(p, '.', tok - p);
    if (dot) {
      if (tok - dot == 2 && dot[1] == '*') { if (!c->wildcard) { c->wildcard = 1; push_int(&wild, &wild_count, &wild_cap, c->fd); } }
      else { int s = symbol_of(dot + 1, tok - dot - 1); if (s >= 0) { push_int(&subs_of[s], &subs_count[s], &subs_cap[s], c->fd); if (s >= symbols_seen) symbols_seen = s + 1; } }
    }
    p = tok + 1;
  }
  const char *ok = "[{\"ev\":\"status\",\"status\":\"success\",\"message\":\"subscribed\"}]";
  send_text(c, ok, strlen(ok));
}

static void on_client_message(conn_t *c, char *m, size_t n) {
  char *params = memmem(m, n, "\"params\"", 8);
  if (!params) return;
  char *v = memchr(params + 8, '"', m + n - params - 8);
  if (!v) return;
  v++;
  char *end = memchr(v, '"', m + n - v);
  if (!end) return;
  if (c->state == 1 && memmem(m, n, "\"auth\"", 6)) {
    const char *ok = "[{\"ev\":\"status\",\"status\":\"auth_success\",\"message\":\"authenticated\"}]";
    send_text(c, ok, strlen(ok));
    c->state = 2; streaming++;
  } else if (c->state == 2 && memmem(m, n, "\"subscribe\"", 11)) {
    subscribe(c, v, end);
  }
}

static void accept_key(const char *key, size_t n, char out[64]) {
  char buf[256];
  snprintf(buf, sizeof buf, "%.*s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", (int)n, key);
  unsigned char sha[20];
  SHA1((unsigned char *)buf, strlen(buf), sha);
  EVP_EncodeBlock((unsigned char *)out, sha, 20);
}

static void on_client_bytes(conn_t *c) {
  if (c->state == 0) {
    char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!end) return;
    if (!strncmp((char *)c->in, "GET /healthz", 12)) {
      char body[64], resp[256];
      int bn = snprintf(body, sizeof body, "{\"subscribers\":%d}", streaming);
      int rn = snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", bn, body);
      if (write(c->fd, resp, rn) < 0) {}
      close_conn(c);
      return;
    }
    char *k = memmem(c->in, end - (char *)c->in, "Sec-WebSocket-Key:", 18);
    if (!k) { close_conn(c); return; }
    k += 18; while (*k == ' ') k++;
    char *ke = k; while (ke < end && *ke != '\r') ke++;
    char acc[64], resp[256];
    accept_key(k, ke - k, acc);
    int rn = snprintf(resp, sizeof resp, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", acc);
    struct iovec iov = {resp, (size_t)rn};
    send_iov(c, &iov, 1);
    const char *hello = "[{\"ev\":\"status\",\"status\":\"connected\",\"message\":\"Connected Successfully\"}]";
    send_text(c, hello, strlen(hello));
    size_t used = end + 4 - (char *)c->in;
    memmove(c->in, c->in + used, c->in_len - used); c->in_len -= used;
    c->state = 1;
  }
  size_t off = 0;
  while (c->state == 1 || c->state == 2) {  // client frames: masked, small, unfragmented
    unsigned char *h = c->in + off;
    uint64_t len;
    size_t hl = frame_header(h, c->in_len - off, &len);
    if (len > 65535) { close_conn(c); return; }
    if (!hl) break;
    int op = h[0] & 15;
    unsigned char *mk = h + hl - 4, *payload = h + hl;
    if (h[1] & 0x80) for (uint64_t i = 0; i < len; i++) payload[i] ^= mk[i & 3];
    if (op == 8) { close_conn(c); return; }
    if (op == 1) on_client_message(c, (char *)payload, len);
    off += hl + len;
  }
  if (off) { memmove(c->in, c->in + off, c->in_len - off); c->in_len -= off; }
}

// ---------- upstream ----------
static int up_fd;
static unsigned char *up_in; static size_t up_len, up_cap;

static void up_send(const char *s) {
  unsigned char h[14];
  size_t n = strlen(s), hn = ws_header(h, 1, n, 1);  // zero mask key: the payload as is
  if (write(up_fd, h, hn) < 0 || write(up_fd, s, n) < 0) { perror("upstream write"); exit(2); }
}

static void touch(conn_t *c, const char *ev, size_t n) {
  if (!c->touched) { c->touched = 1; c->build_len = 1; push_int(&touched, &touched_count, &touched_cap, c->fd); }
  grow(&c->build, &c->build_cap, c->build_len + n + 2);
  if (c->build_len > 1) c->build[c->build_len++] = ',';
  memcpy(c->build + c->build_len, ev, n); c->build_len += n;
}

// One upstream message: each event to its symbol's subscribers, then one frame per touched client.
static void on_upstream_message(char *m, size_t n) {
  char *p = m, *end = m + n;
  while ((p = memchr(p, '{', end - p))) {
    char *brace = memchr(p, '}', end - p);
    if (!brace) break;
    size_t len = brace + 1 - p;
    char *sym = memmem(p, len, "\"sym\":\"", 7);
    if (sym) {
      sym += 7;
      char *se = memchr(sym, '"', brace - sym);
      int s = se ? symbol_of(sym, se - sym) : -1;
      if (s >= 0) for (int i = 0; i < subs_count[s]; i++) touch(conns[subs_of[s][i]], p, len);
      for (int i = 0; i < wild_count; i++) touch(conns[wild[i]], p, len);
    }
    p = brace + 1;
  }
  for (int i = 0; i < touched_count; i++) {
    conn_t *c = conns[touched[i]];
    c->touched = 0;
    c->build[0] = '[';
    c->build[c->build_len++] = ']';
    unsigned char h[14];
    struct iovec iov[2] = {{h, ws_header(h, 1, c->build_len, 0)}, {c->build, c->build_len}};
    send_iov(c, iov, 2);
  }
  touched_count = 0;
}

static void on_upstream_bytes(void) {
  size_t off = 0;
  for (;;) {
    unsigned char *h = up_in + off;
    uint64_t len;
    size_t hl = frame_header(h, up_len - off, &len);
    if (!hl) break;
    int op = h[0] & 15;
    if (op == 1) on_upstream_message((char *)h + hl, len);
    off += hl + len;
  }
  if (off) { memmove(up_in, up_in + off, up_len - off); up_len -= off; }
}

static void connect_upstream(int port) {
  up_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  while (connect(up_fd, (void *)&a, sizeof a)) {  // fanbench may not listen yet
    close(up_fd); usleep(50000); up_fd = socket(AF_INET, SOCK_STREAM, 0);
  }
  int one = 1; setsockopt(up_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char req[256];
  int n = snprintf(req, sizeof req, "GET /stocks HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", port);
  if (write(up_fd, req, n) < 0) { perror("upstream"); exit(2); }
  grow(&up_in, &up_cap, 1 << 20);
  char *hdr_end = NULL;
  while (!hdr_end) {
    ssize_t r = read(up_fd, up_in + up_len, up_cap - up_len - 1);
    if (r <= 0) { perror("upstream handshake"); exit(2); }
    up_len += r; up_in[up_len] = 0;
    hdr_end = strstr((char *)up_in, "\r\n\r\n");
  }
  size_t used = hdr_end + 4 - (char *)up_in;
  memmove(up_in, up_in + used, up_len - used); up_len -= used;
  up_send("{\"action\":\"auth\",\"params\":\"k\"}");
  up_send("{\"action\":\"subscribe\",\"params\":\"Q.*\"}");
  fcntl(up_fd, F_SETFL, O_NONBLOCK);
}

int main(int argc, char **argv) {
  int port = 8080, upstream_port = 9009;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--listen")) port = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--upstream-port")) upstream_port = atoi(argv[i + 1]);
  }
  signal(SIGPIPE, SIG_IGN);
  conns_cap = 1 << 17;
  conns = calloc(conns_cap, sizeof *conns);
  ep = epoll_create1(0);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(ls, (void *)&a, sizeof a) || listen(ls, 4096)) { perror("listen"); return 2; }
  struct epoll_event e = {.events = EPOLLIN, .data.fd = ls};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &e);
  connect_upstream(upstream_port);
  e.data.fd = up_fd;
  epoll_ctl(ep, EPOLL_CTL_ADD, up_fd, &e);
  if (up_len) on_upstream_bytes();
  struct epoll_event evs[256];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == ls) {
        int c;
        while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          if (c >= conns_cap) { close(c); continue; }
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[c] = calloc(1, sizeof(conn_t));
          conns[c]->fd = c;
          struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
        }
      } else if (fd == up_fd) {
        for (;;) {
          grow(&up_in, &up_cap, up_len + 65536);
          ssize_t r = read(up_fd, up_in + up_len, up_cap - up_len);
          if (r > 0) { up_len += r; on_upstream_bytes(); continue; }
          if (r == 0) { fprintf(stderr, "ceiling-relay: upstream closed\n"); return 0; }
          break;
        }
      } else if (conns[fd]) {
        conn_t *c = conns[fd];
        if (evs[i].events & EPOLLOUT) { flush_out(c); if (!conns[fd]) continue; }
        if (!(evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
        grow(&c->in, &c->in_cap, c->in_len + 1024);
        ssize_t r = read(fd, c->in + c->in_len, c->in_cap - c->in_len);
        if (r <= 0) { if (r == 0 || errno != EAGAIN) close_conn(c); continue; }
        c->in_len += r;
        on_client_bytes(c);
      }
    }
  }
}
