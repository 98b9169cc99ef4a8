// One fast WebSocket reader for the relay's Polygon protocol, in C so the client is not the bound when
// measuring how fast the relay replays a tape (`scripts/replay_bench`).
//
//   replay_reader PORT PATH KEY TOPICS SECONDS
//
// Connects to 127.0.0.1:PORT, upgrades PATH, authenticates with KEY, subscribes TOPICS, then reads for
// at most SECONDS, or until a `replay` status with "state":"ended". Counts market events (objects
// whose "ev" is not "status") by scanning each text frame for `"ev":"`. Prints one JSON line: events
// read, seconds from the first event to the last (or to the end), events/s, bytes, frames, and whether
// the replay's end was seen. Answers pings. Standard library and POSIX only.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int write_all(int fd, const void *data, size_t length) {
    const char *bytes = data;
    while (length > 0) {
        ssize_t written = write(fd, bytes, length);
        if (written < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        bytes += written;
        length -= (size_t)written;
    }
    return 0;
}

// A masked client frame (RFC 6455: a client masks what it sends).
static int send_frame(int fd, int opcode, const char *payload, size_t length) {
    unsigned char header[14];
    size_t used = 0;
    header[used++] = (unsigned char)(0x80 | opcode);
    if (length < 126) {
        header[used++] = (unsigned char)(0x80 | length);
    } else if (length < 65536) {
        header[used++] = 0x80 | 126;
        header[used++] = (unsigned char)(length >> 8);
        header[used++] = (unsigned char)length;
    } else {
        return -1;
    }
    unsigned char mask[4] = {0x12, 0x34, 0x56, 0x78};
    memcpy(header + used, mask, 4);
    used += 4;
    char *masked = malloc(length + 1);
    if (!masked) return -1;
    for (size_t i = 0; i < length; i++) masked[i] = (char)(payload[i] ^ mask[i % 4]);
    int failed = write_all(fd, header, used) || write_all(fd, masked, length);
    free(masked);
    return failed ? -1 : 0;
}

// Occurrences of `needle` in `haystack`.
static long count(const char *haystack, size_t length, const char *needle) {
    size_t needle_length = strlen(needle);
    long found = 0;
    const char *at = haystack;
    const char *end = haystack + length;
    while (at < end) {
        const char *hit = memmem(at, (size_t)(end - at), needle, needle_length);
        if (!hit) break;
        found++;
        at = hit + needle_length;
    }
    return found;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s PORT PATH KEY TOPICS SECONDS\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    const char *path = argv[2];
    double limit = atof(argv[5]);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        perror("connect");
        return 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char request[512];
    snprintf(request, sizeof request,
             "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
             path, port);
    if (write_all(fd, request, strlen(request))) return 1;

    size_t capacity = 8 << 20;
    char *buffer = malloc(capacity);
    size_t filled = 0;
    // The upgrade's answer, up to its blank line.
    for (;;) {
        ssize_t got = read(fd, buffer + filled, capacity - filled);
        if (got <= 0) {
            fprintf(stderr, "no upgrade answer\n");
            return 1;
        }
        filled += (size_t)got;
        char *end = memmem(buffer, filled, "\r\n\r\n", 4);
        if (end) {
            if (strncmp(buffer, "HTTP/1.1 101", 12) != 0) {
                fprintf(stderr, "upgrade refused: %.*s\n", (int)(end - buffer), buffer);
                return 1;
            }
            size_t header_length = (size_t)(end - buffer) + 4;
            memmove(buffer, buffer + header_length, filled - header_length);
            filled -= header_length;
            break;
        }
    }
    char message[1024];
    snprintf(message, sizeof message, "{\"action\":\"auth\",\"params\":\"%s\"}", argv[3]);
    send_frame(fd, 1, message, strlen(message));
    snprintf(message, sizeof message, "{\"action\":\"subscribe\",\"params\":\"%s\"}", argv[4]);
    send_frame(fd, 1, message, strlen(message));

    long events = 0, frames = 0, bytes = 0;
    int ended = 0;
    double started = now_seconds(), first = 0, last = 0;
    while (!ended && now_seconds() - started < limit) {
        // Every whole frame in the buffer.
        size_t at = 0;
        for (;;) {
            if (filled - at < 2) break;
            unsigned char *head = (unsigned char *)buffer + at;
            int opcode = head[0] & 0x0F;
            uint64_t length = head[1] & 0x7F;
            size_t header_length = 2;
            if (length == 126) {
                if (filled - at < 4) break;
                length = ((uint64_t)head[2] << 8) | head[3];
                header_length = 4;
            } else if (length == 127) {
                if (filled - at < 10) break;
                length = 0;
                for (int i = 0; i < 8; i++) length = (length << 8) | head[2 + i];
                header_length = 10;
            }
            if (header_length + length > capacity) {
                fprintf(stderr, "a frame of %llu bytes\n", (unsigned long long)length);
                return 1;
            }
            if (filled - at < header_length + length) break;
            const char *payload = buffer + at + header_length;
            if (opcode == 1) {
                long objects = count(payload, (size_t)length, "\"ev\":\"");
                long statuses = count(payload, (size_t)length, "\"ev\":\"status\"");
                if (objects > statuses) {
                    if (events == 0) first = now_seconds();
                    events += objects - statuses;
                    last = now_seconds();
                }
                if (statuses > 0 && memmem(payload, (size_t)length, "\"state\":\"ended\"", 15)) ended = 1;
                frames++;
                bytes += (long)length;
            } else if (opcode == 9) {
                send_frame(fd, 10, payload, (size_t)length);
            } else if (opcode == 8) {
                // Closed by the relay.
                limit = 0;
            }
            at += header_length + length;
        }
        memmove(buffer, buffer + at, filled - at);
        filled -= at;
        if (limit == 0) break;
        ssize_t got = read(fd, buffer + filled, capacity - filled);
        if (got <= 0) break;
        filled += (size_t)got;
    }
    double seconds = last > first ? last - first : 0;
    printf("{\"events\":%ld,\"seconds\":%.3f,\"events_per_second\":%.0f,\"bytes\":%ld,\"frames\":%ld,\"ended\":%s}\n", events, seconds,
           seconds > 0 ? (double)events / seconds : 0, bytes, frames, ended ? "true" : "false");
    close(fd);
    return 0;
}
