// A REST load generator in C for scripts/rest_bench's live scenario, so the relay's answer times are
// measured without a Python event loop sharing the cores: N keep-alive HTTP/1.1 clients on one epoll
// thread, each asking every path of its list once a second, one request in flight at a time (as an
// official client does), and each client's second starting at its own offset (client i at i/N s), as
// independent processes would, rather than all at the top of the second.
//
//   rest_load PORT KEY SECONDS CLIENTS PATH...
//
// Prints one JSON object: requests answered, per second, statuses, the X-Relay-Source values, the
// latency quantiles (from the request's write to the answer's last byte) and the rounds begun over 1 ms
// late (a client still busy when its next second began starts that round late: its requests' times
// then leave out how long they waited to be asked, so a run with late rounds fell behind).
// With REST_LOAD_TOGETHER=1 every client starts its second at the same instant (the worst case: all
// the second's requests asked at once).
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

typedef struct {
    int fd;
    int busy;         // a request is in flight
    int next_path;    // the index of the next path of this round
    int64_t round_at; // when the next round begins (ns)
    int64_t sent_at;
    char in[1 << 16];
    size_t have;
} Client;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

#define MAX_KINDS 16
static char kinds[MAX_KINDS][48];
static long kind_counts[MAX_KINDS];
static int kind_total;

static void count_kind(const char *text, size_t length) {
    if (length > 47) length = 47;
    for (int i = 0; i < kind_total; i++)
        if (strlen(kinds[i]) == length && memcmp(kinds[i], text, length) == 0) {
            kind_counts[i]++;
            return;
        }
    if (kind_total == MAX_KINDS) return;
    memcpy(kinds[kind_total], text, length);
    kinds[kind_total][length] = 0;
    kind_counts[kind_total++] = 1;
}

// The value of header `name` (lower case, with its colon) in head[0..length), or NULL.
static const char *header(const char *head, size_t length, const char *name, size_t *value_length) {
    size_t n = strlen(name);
    for (const char *line = head; line && line < head + length;) {
        const char *end = memmem(line, head + length - line, "\r\n", 2);
        if (!end) break;
        if ((size_t)(end - line) > n && strncasecmp(line, name, n) == 0) {
            const char *value = line + n;
            while (value < end && *value == ' ') value++;
            *value_length = end - value;
            return value;
        }
        line = end + 2;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: rest_load PORT KEY SECONDS CLIENTS PATH...\n");
        return 2;
    }
    int port = atoi(argv[1]);
    const char *key = argv[2];
    int seconds = atoi(argv[3]);
    int count = atoi(argv[4]);
    int path_count = argc - 5;
    char **requests = calloc(path_count, sizeof(char *));
    size_t *request_lengths = calloc(path_count, sizeof(size_t));
    for (int i = 0; i < path_count; i++) {
        requests[i] = malloc(strlen(argv[5 + i]) + strlen(key) + 128);
        request_lengths[i] = sprintf(requests[i], "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n\r\n", argv[5 + i], port, key);
    }
    Client *clients = calloc(count, sizeof(Client));
    int ep = epoll_create1(0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    int64_t start = now_ns();
    const char *together = getenv("REST_LOAD_TOGETHER");
    int stagger = !(together && strcmp(together, "1") == 0);
    for (int i = 0; i < count; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
            perror("connect");
            return 1;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        clients[i].fd = fd;
        clients[i].round_at = start + (stagger ? (int64_t)i * 1000000000 / count : 0);
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &event);
    }
    size_t latency_capacity = (size_t)count * path_count * (seconds + 2) + 16;
    uint32_t *latencies = malloc(latency_capacity * sizeof(uint32_t));
    size_t answered = 0;
    long late_rounds = 0, errors = 0;
    int64_t stop = start + (int64_t)seconds * 1000000000;
    struct epoll_event events[256];
    for (;;) {
        int64_t now = now_ns();
        int active = 0;
        for (int i = 0; i < count; i++) {
            Client *c = &clients[i];
            if (c->busy) {
                active++;
                continue;
            }
            if (c->next_path == 0 && (now < c->round_at || c->round_at >= stop)) continue;
            if (c->next_path == 0 && now - c->round_at > 1000000) late_rounds++;  // a round begun over 1 ms late
            c->sent_at = now_ns();
            if (write(c->fd, requests[c->next_path], request_lengths[c->next_path]) != (ssize_t)request_lengths[c->next_path]) {
                perror("write");
                return 1;
            }
            c->busy = 1;
            active++;
        }
        if (!active && now >= stop) break;
        int ready = epoll_wait(ep, events, 256, 1);
        for (int e = 0; e < ready; e++) {
            Client *c = &clients[events[e].data.u32];
            if (c->have == sizeof c->in) {
                fprintf(stderr, "an answer's head larger than 64 KiB\n");
                return 1;
            }
            ssize_t got = read(c->fd, c->in + c->have, sizeof c->in - c->have);
            if (got <= 0) {
                fprintf(stderr, "the relay closed a connection\n");
                return 1;
            }
            c->have += got;
            char *end = memmem(c->in, c->have, "\r\n\r\n", 4);
            if (!end) continue;
            size_t head = end + 4 - c->in, length_text = 0, source_length = 0;
            const char *length = header(c->in, head, "content-length:", &length_text);
            if (!length) {
                fprintf(stderr, "an answer without Content-Length (the relay's always have one)\n");
                return 1;
            }
            size_t body = strtoul(length, NULL, 10);
            if (head + body > sizeof c->in) {
                fprintf(stderr, "an answer larger than 64 KiB\n");
                return 1;
            }
            if (c->have < head + body) continue;
            int64_t at = now_ns();
            if (answered < latency_capacity) latencies[answered++] = (uint32_t)((at - c->sent_at) / 1000);
            char kind[48];
            const char *source = header(c->in, head, "x-relay-source:", &source_length);
            int n = snprintf(kind, sizeof kind, "%.3s %.*s", c->in + 9, (int)(source ? source_length : 1), source ? source : "-");
            if (strncmp(c->in + 9, "200", 3) != 0) errors++;
            count_kind(kind, n > 47 ? 47 : (size_t)n);
            memmove(c->in, c->in + head + body, c->have - head - body);
            c->have -= head + body;
            c->busy = 0;
            if (++c->next_path == path_count) {
                c->next_path = 0;
                c->round_at += 1000000000;
            }
        }
    }
    double elapsed = (now_ns() - start) / 1e9;
    qsort(latencies, answered, sizeof(uint32_t), cmp_u32);
#define Q(q) (answered ? latencies[(size_t)((q) * (answered - 1))] / 1000.0 : 0)
    printf("{\"requests\":%zu,\"per_second\":%.0f,\"non_200\":%ld,\"late_rounds\":%ld,\"p50_ms\":%.2f,\"p90_ms\":%.2f,\"p99_ms\":%.2f,"
           "\"p999_ms\":%.2f,\"max_ms\":%.2f,\"answers\":{",
           answered, answered / elapsed, errors, late_rounds, Q(0.5), Q(0.9), Q(0.99), Q(0.999), Q(1.0));
    for (int i = 0; i < kind_total; i++) printf("%s\"%s\":%ld", i ? "," : "", kinds[i], kind_counts[i]);
    printf("}}\n");
    return 0;
}
