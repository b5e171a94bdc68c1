/* orchestrator.logs._fastmerge: the plain-text merge of node logs (`orch logs RUN > file`,
 * merged.log) in C.
 *
 * It produces byte for byte what orchestrator.logs.merge.merge_plain produces (and so what
 * lines.format_line(merge(...), False) prints), from the same node.log copies; the hypothesis test in
 * tests/unit/test_logs_plain.py holds the three to that. The rules, as the Python code states them:
 *
 *  - a line is `<stamp> <stream> [<role><local rank>]:[rank <R>] <text>`, both prefixes optional
 *    (the first is the worker field, node/agent.py's WORKER_FIELD: `is_role_first`, `is_role`
 *    below, held to it byte by byte by tests/unit/test_logs_fastmerge.py; the second the trainer's);
 *    the stamp is `YYYY-MM-DDTHH:MM:SS.uuuuuuZ` and its second must be a real date (year 1-9999,
 *    seconds up to 61, as time.strptime takes it), else the line is torn;
 *  - a torn line (no valid stamp) is shown at the previous line's stamp (the epoch before any)
 *    with no rank, text = the whole line;
 *  - the rank: the trainer's `[rank R] ` if present, else base rank + local rank, else `-`;
 *  - a line redrawn with carriage returns shows its last state: rstrip("\r"), after the last "\r";
 *  - bytes that are not UTF-8 are decoded with "replace", as Python reads the copies;
 *  - unless `raw`, the text is made safe for a terminal as lines.printable does it: the C0 controls
 *    but TAB (and newline, which a line cannot hold), DEL, the C1 controls (U+0080-U+009F) and the
 *    bidirectional marks and overrides (U+200E/F, U+202A-U+202E, U+2066-U+2069) are written as
 *    Python's unicode_escape writes them (`\x1b`, `\r`, `\x9b`, `\u202e`);
 *  - order: by the stamp (as text, which for valid stamps is numeric order), or, when any node
 *    has a clock offset, by the epoch float minus the node's offset computed as Python computes
 *    it; a running maximum per node (a node's own order is kept where its clock stepped back);
 *    ties to the node given first.
 *
 * Memory is one read buffer per node (grown only for a line longer than it) and one output chunk.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define STAMP_LEN 27
#define SEC_LEN 19
#define MID_CACHE 4096 /* ranks 0..MID_CACHE-1 keep their columns per node; larger ones are built per line */

static const char STAMP_PATTERN[] = "DDDD-DD-DDTDD:DD:DD.DDDDDDZ";
static const char EPOCH_STAMP[] = "1970-01-01T00:00:00.000000Z";

typedef struct {
    int fd;
    char *buf;
    Py_ssize_t cap, len, pos; /* unread bytes are buf[pos:len] */
    int eof;
    /* the current line, ready to be written */
    const char *text;
    Py_ssize_t text_len;
    const char *mid; /* " NODE RANK " */
    Py_ssize_t mid_len;
    char stamp[STAMP_LEN]; /* the last valid stamp (the epoch before any) */
    PyObject *fixed;       /* the current line re-encoded after a "replace" decode, or NULL */
    int unsafe;            /* the current text may hold what escape_text escapes */
    /* order */
    int has_key;
    int64_t ikey;
    double fkey;
    double offset;
    /* the last second seen */
    char sec[SEC_LEN];
    int sec_set, sec_ok;
    int64_t epoch;
    /* columns */
    char *node_col; /* " NODE.ljust(width) " */
    Py_ssize_t node_col_len;
    int has_base;
    long long base;
    char **mids; /* per rank < MID_CACHE; [MID_CACHE] is the no-rank columns */
    Py_ssize_t *mid_lens;
    char scratch_mid[512];
    char *big_mid; /* a rank too large for the cache */
} Node;

typedef struct {
    PyObject_HEAD
    Node *nodes;
    Py_ssize_t n;
    Py_ssize_t *heap; /* node indices, smallest (key, index) on top */
    Py_ssize_t heap_len;
    int float_keys;
    int raw; /* the text as written: no escaping */
    int rank_width;
    Py_ssize_t chunk;
    int started;
    PyObject *fds; /* kept alive: the caller's file objects own the descriptors */
} PlainMerge;

/* ------------------------------------------------------------------------ small helpers */

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
/* a role's first byte and the rest: node/agent.py's ROLE (tests/unit/test_logs_fastmerge.py holds them to it) */
static inline int is_role_first(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}
static inline int is_role(unsigned char c) { return is_role_first(c) || c == '-'; }

static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    /* days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm) */
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static inline int num(const unsigned char *p, int k) {
    int v = 0;
    for (int i = 0; i < k; i++) v = v * 10 + (p[i] - '0');
    return v;
}

/* The epoch of a `YYYY-MM-DDTHH:MM:SS` whose characters are already known to be digits in the
 * right places; 0 if it is no date (time.strptime's ranges). */
static int second_epoch(const unsigned char *s, int64_t *epoch) {
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y = num(s, 4), mo = num(s + 5, 2), d = num(s + 8, 2);
    int h = num(s + 11, 2), mi = num(s + 14, 2), se = num(s + 17, 2);
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || se > 61) return 0;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    int dim = mdays[mo - 1] + (mo == 2 && leap);
    if (d > dim) return 0;
    *epoch = days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400 + h * 3600 + mi * 60 + se;
    return 1;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
#define NON_ASCII 1 /* a byte >= 0x80 */
#define CONTROL 2   /* a byte < 0x20 or DEL */

/* What a line holds besides printable ASCII, eight bytes at a time: NON_ASCII | CONTROL. A byte
 * below 0x20 sets the high bit of (w - 0x20 * ONES) & ~w (exactly: a borrow only spreads upwards
 * from a byte that is below 0x20 itself); DEL is a zero byte of w ^ 0x7f * ONES. */
static int scan_line(const unsigned char *s, Py_ssize_t n) {
    int flags = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w, d;
        memcpy(&w, s + i, 8);
        d = w ^ (0x7f * ONES);
        if (w & HIGHS) flags |= NON_ASCII;
        if ((((w - 0x20 * ONES) & ~w) | ((d - ONES) & ~d)) & HIGHS) flags |= CONTROL;
        if (flags == (NON_ASCII | CONTROL)) return flags;
    }
    for (; i < n; i++) {
        if (s[i] & 0x80) flags |= NON_ASCII;
        else if (s[i] < 0x20 || s[i] == 0x7f) flags |= CONTROL;
    }
    return flags;
}

/* lines.printable in C: the text (valid UTF-8, starting at a character) into out, every unsafe
 * character as Python's unicode_escape writes it; at most 4 bytes out per byte in. The length. */
static Py_ssize_t escape_text(char *out, const unsigned char *t, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = t[i];
        unsigned cp;
        if (c < 0x20 || c == 0x7f) {
            if (c == '\t' || c == '\n') { out[k++] = (char)c; continue; }
            out[k++] = '\\';
            if (c == '\r') { out[k++] = 'r'; continue; }
            out[k++] = 'x';
            out[k++] = hex[c >> 4];
            out[k++] = hex[c & 15];
            continue;
        }
        if (c == 0xC2 && i + 1 < n && t[i + 1] <= 0x9F) { /* U+0080-U+009F (t[i+1] >= 0x80: valid UTF-8) */
            c = t[++i];
            out[k++] = '\\';
            out[k++] = 'x';
            out[k++] = hex[c >> 4];
            out[k++] = hex[c & 15];
            continue;
        }
        if (c == 0xE2 && i + 2 < n) {
            unsigned char c1 = t[i + 1], c2 = t[i + 2];
            if ((c1 == 0x80 && (c2 == 0x8E || c2 == 0x8F || (c2 >= 0xAA && c2 <= 0xAE))) ||
                (c1 == 0x81 && c2 >= 0xA6 && c2 <= 0xA9)) {
                cp = ((unsigned)(c & 0x0F) << 12) | ((unsigned)(c1 & 0x3F) << 6) | (unsigned)(c2 & 0x3F);
                out[k++] = '\\';
                out[k++] = 'u';
                out[k++] = hex[(cp >> 12) & 15];
                out[k++] = hex[(cp >> 8) & 15];
                out[k++] = hex[(cp >> 4) & 15];
                out[k++] = hex[cp & 15];
                i += 2;
                continue;
            }
        }
        out[k++] = (char)c;
    }
    return k;
}

/* Strict UTF-8 (what Python's decoder accepts: no overlongs, no surrogates, up to U+10FFFF). */
static int valid_utf8(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        int more;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c == 0xE0) { more = 2; lo = 0xA0; }
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) more = 2;
        else if (c == 0xED) { more = 2; hi = 0x9F; }
        else if (c == 0xF0) { more = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) more = 3;
        else if (c == 0xF4) { more = 3; hi = 0x8F; }
        else return 0;
        if (i + more >= n) return 0; /* runs past the end */
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= more; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += more + 1;
    }
    return 1;
}

/* ------------------------------------------------------------------------ columns */

/* " NODE RANK " for a rank given as text ("-" or "r<digits>"), padded as format_line pads it. */
static Py_ssize_t build_mid(const Node *nd, int rank_width, const char *rank, Py_ssize_t rank_len,
                            char *out) {
    Py_ssize_t k = nd->node_col_len;
    memcpy(out, nd->node_col, (size_t)k);
    for (Py_ssize_t pad = rank_width - rank_len; pad > 0; pad--) out[k++] = ' ';
    memcpy(out + k, rank, (size_t)rank_len);
    k += rank_len;
    out[k++] = ' ';
    return k;
}

static int set_cached_mid(Node *nd, int rank_width, Py_ssize_t slot, const char *rank, Py_ssize_t rank_len) {
    Py_ssize_t need = nd->node_col_len + (rank_width > rank_len ? rank_width : rank_len) + 1;
    char *m = PyMem_Malloc((size_t)need);
    if (m == NULL) { PyErr_NoMemory(); return -1; }
    nd->mid_lens[slot] = build_mid(nd, rank_width, rank, rank_len, m);
    nd->mids[slot] = m;
    return 0;
}

static int mid_for_text(Node *nd, int rank_width, const char *rank, Py_ssize_t rank_len);

/* The columns of a line whose rank is `rank` (>= 0), or no rank (-1). */
static int mid_for(Node *nd, int rank_width, long long rank) {
    Py_ssize_t slot = rank < 0 ? MID_CACHE : (Py_ssize_t)rank;
    if (rank < MID_CACHE) {
        if (nd->mids[slot] == NULL) {
            char txt[32];
            int len = rank < 0 ? snprintf(txt, sizeof txt, "-") : snprintf(txt, sizeof txt, "r%lld", rank);
            if (set_cached_mid(nd, rank_width, slot, txt, len) < 0) return -1;
        }
        nd->mid = nd->mids[slot];
        nd->mid_len = nd->mid_lens[slot];
        return 0;
    }
    char txt[32];
    int len = snprintf(txt, sizeof txt, "r%lld", rank);
    return mid_for_text(nd, rank_width, txt, len);
}

/* The columns for a rank given as text (any length). */
static int mid_for_text(Node *nd, int rank_width, const char *rank, Py_ssize_t rank_len) {
    Py_ssize_t need = nd->node_col_len + (rank_width > rank_len ? rank_width : rank_len) + 1;
    char *out = nd->scratch_mid;
    if (need > (Py_ssize_t)sizeof nd->scratch_mid) {
        PyMem_Free(nd->big_mid);
        nd->big_mid = PyMem_Malloc((size_t)need);
        if (nd->big_mid == NULL) { PyErr_NoMemory(); return -1; }
        out = nd->big_mid;
    }
    nd->mid_len = build_mid(nd, rank_width, rank, rank_len, out);
    nd->mid = out;
    return 0;
}

/* A rank too large for a C integer: Python's int() arithmetic, as global_rank() does it; more
 * digits than int() takes is no rank, as lines.number() says. */
static int mid_for_bigrank(Node *nd, int rank_width, const char *tee, Py_ssize_t tee_len,
                           const char *trainer, Py_ssize_t trainer_len) {
    PyObject *v = NULL, *s = NULL, *b = NULL;
    int rc = -1;
    if (trainer != NULL) {
        s = PyUnicode_FromStringAndSize(trainer, trainer_len);
        if (s == NULL) goto done;
        v = PyLong_FromUnicodeObject(s, 10);
    } else {
        s = PyUnicode_FromStringAndSize(tee, tee_len);
        if (s == NULL) goto done;
        PyObject *local = PyLong_FromUnicodeObject(s, 10);
        if (local == NULL) goto unnumbered;
        PyObject *base = PyLong_FromLongLong(nd->base);
        if (base == NULL) { Py_DECREF(local); goto done; }
        v = PyNumber_Add(base, local);
        Py_DECREF(base);
        Py_DECREF(local);
    }
    if (v == NULL) goto unnumbered;
    Py_DECREF(s);
    s = PyUnicode_FromFormat("r%S", v);
    if (s == NULL) goto done;
    b = PyUnicode_AsUTF8String(s);
    if (b == NULL) goto done;
    rc = mid_for_text(nd, rank_width, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
    goto done;
unnumbered:
    if (PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        rc = mid_for(nd, rank_width, -1);
    }
done:
    Py_XDECREF(v);
    Py_XDECREF(s);
    Py_XDECREF(b);
    return rc;
}

/* digits (no sign) -> value; 0 when longer than 17 significant digits (the caller goes to Python) */
static int small_number(const char *p, Py_ssize_t n, long long *out) {
    while (n > 1 && *p == '0') { p++; n--; }
    if (n > 17) return 0;
    long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) v = v * 10 + (p[i] - '0');
    *out = v;
    return 1;
}

/* ------------------------------------------------------------------------ one node's lines */

/* Make buf[pos:] hold a whole line (or the torn rest at end of file); its length in *line_len
 * and whether one was found. */
static int next_raw(Node *nd, const char **line, Py_ssize_t *line_len) {
    for (;;) {
        char *start = nd->buf + nd->pos;
        Py_ssize_t avail = nd->len - nd->pos;
        char *nl = avail > 0 ? memchr(start, '\n', (size_t)avail) : NULL;
        if (nl != NULL) {
            *line = start;
            *line_len = nl - start;
            nd->pos += *line_len + 1;
            return 1;
        }
        if (nd->eof) {
            if (avail > 0) { /* a torn last line: shown as if it ended with a newline */
                *line = start;
                *line_len = avail;
                nd->pos = nd->len;
                return 1;
            }
            return 0;
        }
        if (nd->pos > 0) { /* keep the partial line, read more after it */
            memmove(nd->buf, start, (size_t)avail);
            nd->len = avail;
            nd->pos = 0;
        }
        if (nd->len == nd->cap) { /* a line longer than the buffer */
            Py_ssize_t cap = nd->cap * 2;
            char *b = PyMem_Realloc(nd->buf, (size_t)cap);
            if (b == NULL) { PyErr_NoMemory(); return -1; }
            nd->buf = b;
            nd->cap = cap;
        }
        Py_ssize_t want = nd->cap - nd->len;
        ssize_t got;
        Py_BEGIN_ALLOW_THREADS
        do {
            got = read(nd->fd, nd->buf + nd->len, (size_t)want);
        } while (got < 0 && errno == EINTR);
        Py_END_ALLOW_THREADS
        if (got < 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
        if (got == 0) nd->eof = 1;
        nd->len += got;
    }
}

static inline void update_key(Node *nd, int float_keys, int64_t epoch, int usec) {
    if (float_keys) {
        double k = ((double)epoch + (double)usec / 1000000.0) - nd->offset;
        if (!nd->has_key || k > nd->fkey) nd->fkey = k;
    } else {
        int64_t k = epoch * 1000000 + usec;
        if (!nd->has_key || k > nd->ikey) nd->ikey = k;
    }
    nd->has_key = 1;
}

/* Advance a node to its next line and parse it; 0 at its end, -1 on error. */
static int advance(PlainMerge *self, Node *nd) {
    const char *raw;
    Py_ssize_t n;
    Py_CLEAR(nd->fixed);
    int got = next_raw(nd, &raw, &n);
    if (got <= 0) return got;
    const unsigned char *s = (const unsigned char *)raw;
    int flags = scan_line(s, n);
    /* the stamp and the columns are printable: only the text can hold what must be escaped */
    nd->unsafe = flags != 0 && !self->raw;
    if ((flags & NON_ASCII) && !valid_utf8(s, n)) { /* as Python decodes it: errors="replace" */
        PyObject *u = PyUnicode_DecodeUTF8(raw, n, "replace");
        if (u == NULL) return -1;
        nd->fixed = PyUnicode_AsUTF8String(u);
        Py_DECREF(u);
        if (nd->fixed == NULL) return -1;
        raw = PyBytes_AS_STRING(nd->fixed);
        n = PyBytes_GET_SIZE(nd->fixed);
        s = (const unsigned char *)raw;
    }
    /* the stamp: its second cached, the rest checked character by character */
    int ok = n >= STAMP_LEN && (n == STAMP_LEN || s[STAMP_LEN] == ' ');
    if (ok) {
        int same = nd->sec_set && memcmp(s, nd->sec, SEC_LEN) == 0;
        for (int i = same ? SEC_LEN : 0; i < STAMP_LEN; i++) {
            char p = STAMP_PATTERN[i];
            if (p == 'D' ? !is_digit(s[i]) : s[i] != (unsigned char)p) { ok = 0; break; }
        }
        if (ok && !same) {
            memcpy(nd->sec, s, SEC_LEN);
            nd->sec_set = 1;
            nd->sec_ok = second_epoch(s, &nd->epoch);
        }
        ok = ok && nd->sec_ok;
    }
    if (!ok) { /* torn: the previous stamp, no rank, the whole line */
        if (!nd->has_key) {
            if (self->float_keys) nd->fkey = -nd->offset;
            else nd->ikey = 0;
            nd->has_key = 1;
        }
        if (mid_for(nd, self->rank_width, -1) < 0) return -1;
        nd->text = raw;
        nd->text_len = n;
    } else {
        memcpy(nd->stamp, s, STAMP_LEN);
        update_key(nd, self->float_keys, nd->epoch, num(s + 20, 6));
        /* the head: the stream up to the next space, then the two optional prefixes */
        Py_ssize_t p = n;
        const char *tee = NULL, *trainer = NULL;
        Py_ssize_t tee_len = 0, trainer_len = 0;
        if (n > STAMP_LEN) {
            const char *sp = memchr(raw + STAMP_LEN + 1, ' ', (size_t)(n - STAMP_LEN - 1));
            if (sp != NULL) {
                p = sp - raw + 1;
                if (p + 1 < n && s[p] == '[' && is_role_first(s[p + 1])) {
                    Py_ssize_t q = p + 2;
                    while (q < n && is_role(s[q])) q++;
                    Py_ssize_t d0 = q;
                    while (q < n && is_digit(s[q])) q++;
                    if (q > d0 && q + 1 < n && s[q] == ']' && s[q + 1] == ':') {
                        tee = raw + d0;
                        tee_len = q - d0;
                        p = q + 2;
                    }
                }
                if (n - p >= 8 && memcmp(raw + p, "[rank ", 6) == 0) {
                    Py_ssize_t q = p + 6;
                    while (q < n && is_digit(s[q])) q++;
                    if (q > p + 6 && q + 1 < n && s[q] == ']' && s[q + 1] == ' ') {
                        trainer = raw + p + 6;
                        trainer_len = q - (p + 6);
                        p = q + 2;
                    }
                }
            }
        }
        long long v;
        int rc;
        if (trainer != NULL) {
            rc = small_number(trainer, trainer_len, &v)
                     ? mid_for(nd, self->rank_width, v)
                     : mid_for_bigrank(nd, self->rank_width, NULL, 0, trainer, trainer_len);
        } else if (tee != NULL && nd->has_base) {
            rc = small_number(tee, tee_len, &v) ? mid_for(nd, self->rank_width, nd->base + v)
                                                : mid_for_bigrank(nd, self->rank_width, tee, tee_len, NULL, 0);
        } else {
            rc = mid_for(nd, self->rank_width, -1); /* no rank */
        }
        if (rc < 0) return -1;
        nd->text = raw + p;
        nd->text_len = n - p;
    }
    /* a line redrawn with carriage returns: what the terminal would show last */
    if (nd->text_len > 0 && memchr(nd->text, '\r', (size_t)nd->text_len) != NULL) {
        Py_ssize_t e = nd->text_len;
        while (e > 0 && nd->text[e - 1] == '\r') e--;
        Py_ssize_t b = e;
        while (b > 0 && nd->text[b - 1] != '\r') b--;
        nd->text += b;
        nd->text_len = e - b;
    }
    return 1;
}

/* ------------------------------------------------------------------------ the merge */

static inline int before(const PlainMerge *self, Py_ssize_t a, Py_ssize_t b) {
    const Node *x = &self->nodes[a], *y = &self->nodes[b];
    if (self->float_keys) {
        if (x->fkey != y->fkey) return x->fkey < y->fkey;
    } else if (x->ikey != y->ikey) {
        return x->ikey < y->ikey;
    }
    return a < b;
}

static void sift_down(PlainMerge *self, Py_ssize_t i) {
    Py_ssize_t *h = self->heap, n = self->heap_len, top = h[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(self, h[c + 1], h[c])) c++;
        if (!before(self, h[c], top)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = top;
}

static int start(PlainMerge *self) {
    self->started = 1;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        int got = advance(self, &self->nodes[i]);
        if (got < 0) return -1;
        if (got) self->heap[self->heap_len++] = i;
    }
    for (Py_ssize_t i = self->heap_len / 2 - 1; i >= 0; i--) sift_down(self, i);
    return 0;
}

static PyObject *PlainMerge_next(PlainMerge *self) {
    if (!self->started && start(self) < 0) return NULL;
    if (self->heap_len == 0) return NULL;
    Py_ssize_t cap = self->chunk + 4096, len = 0;
    char *out = PyMem_Malloc((size_t)cap);
    if (out == NULL) return PyErr_NoMemory();
    while (self->heap_len > 0 && len < self->chunk) {
        Node *nd = &self->nodes[self->heap[0]];
        Py_ssize_t need = STAMP_LEN + nd->mid_len + (nd->unsafe ? 4 * nd->text_len : nd->text_len) + 1;
        if (len + need > cap) {
            cap = (len + need) * 2;
            char *o = PyMem_Realloc(out, (size_t)cap);
            if (o == NULL) { PyMem_Free(out); return PyErr_NoMemory(); }
            out = o;
        }
        memcpy(out + len, nd->stamp, STAMP_LEN);
        len += STAMP_LEN;
        memcpy(out + len, nd->mid, (size_t)nd->mid_len);
        len += nd->mid_len;
        if (nd->unsafe) {
            len += escape_text(out + len, (const unsigned char *)nd->text, nd->text_len);
        } else {
            memcpy(out + len, nd->text, (size_t)nd->text_len);
            len += nd->text_len;
        }
        out[len++] = '\n';
        int got = advance(self, nd);
        if (got < 0) { PyMem_Free(out); return NULL; }
        if (got == 0) self->heap[0] = self->heap[--self->heap_len]; /* this node is done */
        if (self->heap_len > 0) sift_down(self, 0);
    }
    PyObject *chunk = PyBytes_FromStringAndSize(out, len);
    PyMem_Free(out);
    return chunk;
}

/* ------------------------------------------------------------------------ the type */

static void free_nodes(PlainMerge *self) {
    if (self->nodes == NULL) return;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Node *nd = &self->nodes[i];
        PyMem_Free(nd->buf);
        PyMem_Free(nd->node_col);
        PyMem_Free(nd->big_mid);
        Py_CLEAR(nd->fixed);
        if (nd->mids != NULL)
            for (Py_ssize_t k = 0; k <= MID_CACHE; k++) PyMem_Free(nd->mids[k]);
        PyMem_Free(nd->mids);
        PyMem_Free(nd->mid_lens);
    }
    PyMem_Free(self->nodes);
    self->nodes = NULL;
}

static void PlainMerge_dealloc(PlainMerge *self) {
    free_nodes(self);
    PyMem_Free(self->heap);
    Py_XDECREF(self->fds);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int PlainMerge_init(PlainMerge *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"fds", "node_columns", "base_ranks", "offsets", "rank_width", "float_keys", "block",
                         "chunk", "raw", NULL};
    PyObject *fds, *cols, *bases, *offsets, *float_keys = Py_None;
    int rank_width, raw = 0;
    Py_ssize_t block = 1 << 20, chunk = 1 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOi|Onnp", kw, &fds, &cols, &bases, &offsets, &rank_width,
                                     &float_keys, &block, &chunk, &raw))
        return -1;
    if (self->nodes != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "PlainMerge is initialised once");
        return -1;
    }
    fds = PySequence_Tuple(fds);
    if (fds == NULL) return -1;
    self->fds = fds;
    Py_ssize_t n = PyTuple_GET_SIZE(fds);
    if (PySequence_Size(cols) != n || PySequence_Size(bases) != n || PySequence_Size(offsets) != n) {
        PyErr_SetString(PyExc_ValueError, "fds, node_columns, base_ranks and offsets differ in length");
        return -1;
    }
    if (block < 16) block = 16;
    if (chunk < 4096) chunk = 4096;
    self->chunk = chunk;
    self->raw = raw;
    self->rank_width = rank_width < 0 ? 0 : rank_width;
    self->nodes = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Node));
    self->heap = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    if (self->nodes == NULL || self->heap == NULL) { PyErr_NoMemory(); return -1; }
    self->n = n;
    if (float_keys != Py_None) {
        int fk = PyObject_IsTrue(float_keys);
        if (fk < 0) return -1;
        self->float_keys = fk;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Node *nd = &self->nodes[i];
        memcpy(nd->stamp, EPOCH_STAMP, STAMP_LEN);
        PyObject *o = PyTuple_GET_ITEM(fds, i);
        nd->fd = PyObject_AsFileDescriptor(o);
        if (nd->fd < 0) return -1;
        o = PySequence_GetItem(cols, i);
        if (o == NULL) return -1;
        char *c;
        Py_ssize_t clen;
        if (PyBytes_AsStringAndSize(o, &c, &clen) < 0) { Py_DECREF(o); return -1; }
        nd->node_col = PyMem_Malloc((size_t)(clen ? clen : 1));
        if (nd->node_col == NULL) { Py_DECREF(o); PyErr_NoMemory(); return -1; }
        memcpy(nd->node_col, c, (size_t)clen);
        nd->node_col_len = clen;
        Py_DECREF(o);
        o = PySequence_GetItem(bases, i);
        if (o == NULL) return -1;
        if (o != Py_None) {
            nd->base = PyLong_AsLongLong(o);
            nd->has_base = 1;
        }
        Py_DECREF(o);
        if (PyErr_Occurred()) return -1;
        o = PySequence_GetItem(offsets, i);
        if (o == NULL) return -1;
        nd->offset = PyFloat_AsDouble(o) / 1000.0; /* ms, as PlainNode.offset_ms / 1000.0 */
        Py_DECREF(o);
        if (PyErr_Occurred()) return -1;
        if (nd->offset != 0.0 && float_keys == Py_None) self->float_keys = 1;
        nd->cap = block;
        nd->buf = PyMem_Malloc((size_t)block);
        nd->mids = PyMem_Calloc(MID_CACHE + 1, sizeof(char *));
        nd->mid_lens = PyMem_Calloc(MID_CACHE + 1, sizeof(Py_ssize_t));
        if (nd->buf == NULL || nd->mids == NULL || nd->mid_lens == NULL) { PyErr_NoMemory(); return -1; }
    }
    return 0;
}

static PyTypeObject PlainMergeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orchestrator.logs._fastmerge.PlainMerge",
    .tp_basicsize = sizeof(PlainMerge),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR(
        "PlainMerge(fds, node_columns, base_ranks, offsets, rank_width, float_keys=None, block=1 MiB,\n"
        "           chunk=1 MiB, raw=False)\n\n"
        "Iterate the merged plain lines of node.log files (read from the given open descriptors) as\n"
        "bytes chunks of whole lines. node_columns[i] is b' ' + node.ljust(node_width) + b' '\n"
        "(UTF-8), base_ranks[i] an int or None, offsets[i] the node's clock offset in ms. float_keys:\n"
        "order by epoch floats minus the offsets (default: when any offset is not 0), else by the stamp.\n"
        "raw: each line's text as written, else with its control characters escaped (lines.printable)."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PlainMerge_init,
    .tp_dealloc = (destructor)PlainMerge_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)PlainMerge_next,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_fastmerge",
    "The plain-text merge of node logs in C (see orchestrator.logs.merge.merge_plain).", -1, NULL,
};

PyMODINIT_FUNC PyInit__fastmerge(void) {
    if (PyType_Ready(&PlainMergeType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&PlainMergeType);
    if (PyModule_AddObject(m, "PlainMerge", (PyObject *)&PlainMergeType) < 0) {
        Py_DECREF(&PlainMergeType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
