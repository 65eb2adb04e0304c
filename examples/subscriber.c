/* Follow skh's alert bus from C with libzmq and msgpack-c (the contract: docs/alerts.md).
 *
 * Replays the log from the last sequence number it handled (kept in --state), then follows live
 * alerts, replaying again whenever a sequence number is skipped. One line per alert on stdout:
 *   seq <TAB> kind <TAB> state <TAB> alert_id <TAB> severity <TAB> component
 *
 * Build (Debian: libzmq3-dev libmsgpack-dev pkg-config):
 *   cc -O2 -Wall -o subscriber subscriber.c $(pkg-config --cflags --libs libzmq msgpack)
 * Run:
 *   ./subscriber --alerts tcp://analyzer:5561 --replay tcp://analyzer:5562 \
 *       --server-key server.key --client-key me.key_secret --state subscriber.seq
 */
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static const char *alerts_addr, *replay_addr, *server_key, *client_key;
static const char *state_path = "subscriber.seq";
static long idle_ms = -1;
static uint64_t last;
static void *ctx;

static void die(const char *what) {
    fprintf(stderr, "subscriber: %s (%s)\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

/* A ZeroMQ certificate file holds `public-key = "<40 Z85 chars>"` (and `secret-key` in the
 * secret one): copy the named key into out[41]. */
static void load_key(const char *path, const char *name, char out[41]) {
    FILE *f = fopen(path, "r");
    char line[512];
    if (!f) die(path);
    while (fgets(line, sizeof line, f)) {
        char *at = strstr(line, name), *q = at ? strchr(at, '"') : NULL;
        if (q && strlen(q + 1) >= 41 && q[41] == '"') {
            memcpy(out, q + 1, 40);
            out[40] = 0;
            fclose(f);
            return;
        }
    }
    fprintf(stderr, "subscriber: no %s in %s\n", name, path);
    exit(1);
}

static void *connect_to(int kind, const char *addr) {
    void *s = zmq_socket(ctx, kind);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (server_key) { /* CURVE: the server's public key, our own key pair */
        char key[41];
        load_key(server_key, "public-key", key);
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, key, 40);
        load_key(client_key, "public-key", key);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, key, 40);
        load_key(client_key, "secret-key", key);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, key, 40);
    }
    if (kind == ZMQ_SUB) zmq_setsockopt(s, ZMQ_SUBSCRIBE, "alert\0", 6);
    if (zmq_connect(s, addr) != 0) die(addr);
    return s;
}

/* The value of string key `key` in msgpack map `m`, or NULL. */
static msgpack_object *get(msgpack_object *m, const char *key) {
    if (!m || m->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
            memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
            return &m->via.map.ptr[i].val;
    }
    return NULL;
}

static uint64_t get_u64(msgpack_object *m, const char *key) {
    msgpack_object *v = get(m, key);
    return v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? v->via.u64 : 0;
}

static void put_str(msgpack_object *m, const char *key, int last_field) {
    msgpack_object *v = get(m, key);
    if (v && v->type == MSGPACK_OBJECT_STR) fwrite(v->via.str.ptr, 1, v->via.str.size, stdout);
    fputc(last_field ? '\n' : '\t', stdout);
}

/* Print first, then remember: a crash in between repeats one alert and loses none. */
static void handle(msgpack_object *rec) {
    msgpack_object *alert = get(rec, "alert");
    last = get_u64(rec, "seq");
    printf("%llu\t", (unsigned long long)last);
    put_str(alert, "kind", 0);
    put_str(alert, "state", 0);
    put_str(alert, "alert_id", 0);
    put_str(alert, "severity", 0);
    put_str(alert, "component", 1);
    fflush(stdout);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", state_path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%llu", (unsigned long long)last) < 0 || fclose(f) != 0 ||
        rename(tmp, state_path) != 0)
        die("cannot write the state file");
}

/* Unpack one envelope, check its version and type; returns its body (valid while `u` lives). */
static msgpack_object *body_of(msgpack_unpacked *u, zmq_msg_t *msg, const char *want) {
    msgpack_unpacked_init(u);
    if (msgpack_unpack_next(u, zmq_msg_data(msg), zmq_msg_size(msg), NULL) !=
        MSGPACK_UNPACK_SUCCESS)
        die("undecodable frame");
    msgpack_object *type = get(&u->data, "type");
    if (get_u64(&u->data, "v") != 1 || !type || type->type != MSGPACK_OBJECT_STR ||
        type->via.str.size != strlen(want) || memcmp(type->via.str.ptr, want, strlen(want)))
        die("unexpected message (wire version or type)");
    return get(&u->data, "body");
}

/* Replay from `last`, page by page, until the log's end. */
static void replay(void) {
    void *req = connect_to(ZMQ_REQ, replay_addr);
    for (;;) {
        msgpack_sbuffer buf;
        msgpack_packer pk;
        msgpack_sbuffer_init(&buf);
        msgpack_packer_init(&pk, &buf, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 5);
        msgpack_pack_str_with_body(&pk, "v", 1);
        msgpack_pack_int(&pk, 1);
        msgpack_pack_str_with_body(&pk, "type", 4);
        msgpack_pack_str_with_body(&pk, "replay", 6);
        msgpack_pack_str_with_body(&pk, "sender", 6);
        msgpack_pack_str_with_body(&pk, "example-c", 9);
        msgpack_pack_str_with_body(&pk, "seq", 3);
        msgpack_pack_int(&pk, 0);
        msgpack_pack_str_with_body(&pk, "body", 4);
        msgpack_pack_map(&pk, 1);
        msgpack_pack_str_with_body(&pk, "since", 5);
        msgpack_pack_uint64(&pk, last);
        if (zmq_send(req, buf.data, buf.size, 0) < 0) die("replay request");
        msgpack_sbuffer_destroy(&buf);
        zmq_pollitem_t item = {req, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 5000) != 1) die("no replay answer from the analyzer");
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, req, 0) < 0) die("replay answer");
        msgpack_unpacked u;
        msgpack_object *page = body_of(&u, &msg, "replay_reply");
        msgpack_object *recs = get(page, "alerts");
        uint32_t n = recs && recs->type == MSGPACK_OBJECT_ARRAY ? recs->via.array.size : 0;
        for (uint32_t i = 0; i < n; i++)
            if (get_u64(&recs->via.array.ptr[i], "seq") > last) handle(&recs->via.array.ptr[i]);
        int done = n == 0 || last >= get_u64(page, "last_seq");
        msgpack_unpacked_destroy(&u);
        zmq_msg_close(&msg);
        if (done) break;
    }
    zmq_close(req);
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--alerts")) alerts_addr = v;
        else if (!strcmp(k, "--replay")) replay_addr = v;
        else if (!strcmp(k, "--server-key")) server_key = v;
        else if (!strcmp(k, "--client-key")) client_key = v;
        else if (!strcmp(k, "--state")) state_path = v;
        else if (!strcmp(k, "--idle-exit")) idle_ms = (long)(atof(v) * 1000);
        else {
            fprintf(stderr, "subscriber: unknown option %s\n", k);
            return 2;
        }
    }
    if (!alerts_addr || !replay_addr || (server_key && !client_key)) {
        fprintf(stderr, "usage: subscriber --alerts ADDR --replay ADDR [--server-key F "
                        "--client-key F] [--state F] [--idle-exit S]\n");
        return 2;
    }
    FILE *f = fopen(state_path, "r");
    if (f) {
        unsigned long long v = 0;
        if (fscanf(f, "%llu", &v) == 1) last = v;
        fclose(f);
    }
    ctx = zmq_ctx_new();
    void *sub = connect_to(ZMQ_SUB, alerts_addr); /* before the replay: nothing falls between */
    replay();
    for (;;) {
        zmq_pollitem_t item = {sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, idle_ms) < 1) break;
        zmq_msg_t topic, msg;
        zmq_msg_init(&topic);
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&topic, sub, 0) < 0 || zmq_msg_recv(&msg, sub, 0) < 0) die("recv");
        msgpack_unpacked u;
        msgpack_object *rec = body_of(&u, &msg, "alert");
        uint64_t seq = get_u64(rec, "seq");
        if (seq > last + 1)
            replay(); /* a gap: the log has what we missed */
        else if (seq == last + 1)
            handle(rec);
        msgpack_unpacked_destroy(&u);
        zmq_msg_close(&topic);
        zmq_msg_close(&msg);
    }
    zmq_close(sub);
    zmq_ctx_term(ctx);
    return 0;
}
