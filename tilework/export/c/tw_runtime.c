/* tilework ahead-of-time export: the runtime of an exported model.
 *
 * - tw_model_create maps the weights file read-only and checks it against the library
 *   (magic, format version, the export id, each array's byte count), then allocates the static
 *   pools (every planned storage whose size is bounded, sized at export, one block) and the
 *   register stack.
 * - Pooled storage (planned blocks whose size depends on unbounded dims) comes from one arena
 *   of blocks in size classes (four per power of two, at least 256 bytes), as in the Python VM
 *   (tilework/runtime/memory.py): a released block serves the next request of its class.
 * - Fresh tensors (outputs, unplanned allocations) are blocks kept until the next run: a run
 *   reuses the previous run's blocks where they fit and frees the rest at its end.
 * The helpers do what the VM builtins of the same name do, with the same messages. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tw_internal.h"

#define TW_ALIGN 64
#define TW_MIN_CLASS 256
static const char TW_MAGIC[8] = {'T', 'W', 'B', 'L', 'O', 'B', '\r', '\n'};
#define TW_BLOB_VERSION 1u

typedef struct tw_block {
    struct tw_block* next;
    void* raw;
    char* data;
    int64_t cap;
    int32_t used; /* pooled: lent; fresh: handed out in this run */
} tw_block;

typedef struct tw_chunk {
    struct tw_chunk* next;
} tw_chunk;

struct tw_model {
    char err[4096];
    int err_kind; /* TW_ERR_*: what the last failure was */
    void* map;
    size_t map_len;
    tw_val* arrays;
    void* static_raw;
    char* static_pool;
    tw_val* stack;
    int64_t sp, stack_len;
    tw_block* pool;
    tw_block* fresh;
    tw_chunk* tuples;
    int64_t* out_shapes;
    int32_t out_cap;
};

/* the reason of the last failure on this thread of a call without a model: a create, or a
   call given a NULL model or function (tw_model_error(NULL)) */
static _Thread_local char tw_create_err[4096];

static void no_model_fail(const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void no_model_fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tw_create_err, sizeof tw_create_err, fmt, ap);
    va_end(ap);
}

int twrt_fail(tw_model* m, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    m->err_kind = TW_ERR_CHECK;
    return 1;
}

static tw_model* create_fail(tw_model* m, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tw_create_err, sizeof tw_create_err, fmt, ap);
    va_end(ap);
    tw_model_free(m);
    return NULL;
}

static void* aligned_alloc64(int64_t nbytes, void** raw) {
    *raw = NULL;
    if (nbytes > INT64_MAX - TW_ALIGN) return NULL;
    size_t n = (size_t)(nbytes > 0 ? nbytes : 1) + TW_ALIGN;
    char* r = (char*)malloc(n);
    *raw = r;
    if (r == NULL) return NULL;
    return (void*)(((uintptr_t)r + TW_ALIGN - 1) & ~(uintptr_t)(TW_ALIGN - 1));
}

static uint64_t rd64(const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
static uint32_t rd32(const unsigned char* p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* -- the public API ------------------------------------------------------------------------ */

static void describe_shape(char* buf, size_t n, const int64_t* shape, int32_t ndim);

/* the arrays' descriptors, the static pools and the register stack of a model whose arrays
   are set by the caller */
static tw_model* new_model(void) {
    const tw_export_info* info = &tw__info;
    tw_create_err[0] = 0;
    tw_model* m = (tw_model*)calloc(1, sizeof(tw_model));
    if (m == NULL) return create_fail(NULL, "out of memory");
    m->arrays = (tw_val*)calloc((size_t)(info->num_arrays ? info->num_arrays : 1), sizeof(tw_val));
    if (m->arrays == NULL) return create_fail(m, "out of memory");
    for (int32_t k = 0; k < info->num_arrays; ++k) {
        tw_val* v = &m->arrays[k];
        v->kind = TW_TENSOR;
        v->dtype = info->array_dtype[k];
        v->ndim = info->array_ndim[k];
        memcpy(v->shape, info->array_shape + (size_t)k * TW_MAX_NDIM, sizeof v->shape);
    }
    if (info->static_bytes > 0) {
        m->static_pool = (char*)aligned_alloc64(info->static_bytes, &m->static_raw);
        if (m->static_pool == NULL) return create_fail(m, "cannot allocate the static pools (%" PRId64 " bytes)", info->static_bytes);
    }
    m->stack_len = info->stack_regs;
    m->stack = (tw_val*)calloc((size_t)(m->stack_len ? m->stack_len : 1), sizeof(tw_val));
    if (m->stack == NULL) return create_fail(m, "out of memory");
    return m;
}

tw_model* tw_model_create(const char* path) {
    const tw_export_info* info = &tw__info;
    if (path == NULL) {
        no_model_fail("tw_model_create: weights_path is NULL");
        return NULL;
    }
    tw_model* m = new_model();
    if (m == NULL) return NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return create_fail(m, "cannot open the weights file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return create_fail(m, "cannot read the weights file %s: %s", path, strerror(errno));
    }
    size_t len = (size_t)st.st_size;
    if (len < 32) {
        close(fd);
        return create_fail(m, "%s is not a tilework weights file (%zu bytes)", path, len);
    }
    void* map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return create_fail(m, "cannot map the weights file %s: %s", path, strerror(errno));
    m->map = map;
    m->map_len = len;
    const unsigned char* b = (const unsigned char*)map;
    if (memcmp(b, TW_MAGIC, 8) != 0) return create_fail(m, "%s is not a tilework weights file (bad magic)", path);
    if (rd32(b + 8) != TW_BLOB_VERSION) return create_fail(m, "%s has weights format version %u; this library reads version %u", path, rd32(b + 8), TW_BLOB_VERSION);
    uint32_t count = rd32(b + 12);
    uint64_t id = rd64(b + 16);
    if (id != info->id) return create_fail(m, "%s was written for another export (id %016" PRIx64 ", this library is %016" PRIx64 "): use the weights file exported with this library", path, id, info->id);
    if ((int64_t)count != info->num_arrays || 32 + 16 * (uint64_t)count > len) return create_fail(m, "%s holds %u arrays, the library expects %d", path, count, info->num_arrays);
    for (uint32_t k = 0; k < count; ++k) {
        uint64_t off = rd64(b + 32 + 16 * k), nb = rd64(b + 40 + 16 * k);
        if ((int64_t)nb != info->array_nbytes[k] || off > len || nb > len - off || off % TW_ALIGN)
            return create_fail(m, "%s: array %u has %" PRIu64 " bytes at offset %" PRIu64 ", the library expects %" PRId64 " bytes inside the file", path, k, nb, off, info->array_nbytes[k]);
        m->arrays[k].data = (void*)(b + off);
    }
    return m;
}

static int dtype_of(tw_dtype d);

tw_model* tw_model_create_from_arrays(const tw_tensor* arrays, int num_arrays) {
    const tw_export_info* info = &tw__info;
    if (arrays == NULL && num_arrays > 0) {
        no_model_fail("tw_model_create_from_arrays: arrays is NULL but num_arrays is %d", num_arrays);
        return NULL;
    }
    tw_model* m = new_model();
    if (m == NULL) return NULL;
    if (num_arrays != info->num_arrays) return create_fail(m, "%d arrays given, the library expects %d", num_arrays, info->num_arrays);
    for (int32_t k = 0; k < info->num_arrays; ++k) {
        const tw_tensor* t = &arrays[k];
        tw_val* v = &m->arrays[k];
        int same = t->ndim == v->ndim && (t->ndim == 0 || t->shape != NULL) && dtype_of(t->dtype) == v->dtype && (t->data != NULL || info->array_nbytes[k] == 0);
        for (int32_t d = 0; same && d < v->ndim; ++d) same = t->shape[d] == v->shape[d];
        if (!same) return create_fail(m, "array %d differs from the one the library was made for (its dtype, shape or data)", k);
        v->data = t->data;
    }
    return m;
}

const char* tw_model_error(const tw_model* m) { return m == NULL ? tw_create_err : m->err; }
int tw_model_error_kind(const tw_model* m) {
    if (m == NULL) return tw_create_err[0] == 0 ? TW_ERR_NONE : TW_ERR_CHECK;
    return m->err[0] == 0 ? TW_ERR_NONE : m->err_kind;
}

int tw_model_num_functions(void) { return tw__info.num_functions; }

const char* tw_model_function_name(int index) {
    return index >= 0 && index < tw__info.num_functions ? tw__info.functions[index].name : NULL;
}

static const tw_function_desc* find_function(const char* name) {
    for (int i = 0; i < tw__info.num_functions; ++i)
        if (strcmp(tw__info.functions[i].name, name) == 0) return &tw__info.functions[i];
    return NULL;
}

int tw_model_num_inputs(const char* function) {
    if (function == NULL) {
        no_model_fail("tw_model_num_inputs: function is NULL");
        return -1;
    }
    const tw_function_desc* f = find_function(function);
    if (f == NULL) {
        no_model_fail("no function '%s' in the model", function);
        return -1;
    }
    return f->num_inputs;
}

static void free_blocks(tw_block* b) {
    while (b != NULL) {
        tw_block* next = b->next;
        free(b->raw);
        free(b);
        b = next;
    }
}

static void free_tuples(tw_model* m) {
    while (m->tuples != NULL) {
        tw_chunk* next = m->tuples->next;
        free(m->tuples);
        m->tuples = next;
    }
}

void tw_model_free(tw_model* m) {
    if (m == NULL) return;
    if (m->map != NULL) munmap(m->map, m->map_len);
    free(m->arrays);
    free(m->static_raw);
    free(m->stack);
    free_blocks(m->pool);
    free_blocks(m->fresh);
    free_tuples(m);
    free(m->out_shapes);
    free(m);
}

static int dtype_of(tw_dtype d) {
    for (int i = 0; i < tw__num_dtypes; ++i)
        if (tw__dtypes[i].dl_code == d.code && tw__dtypes[i].dl_bits == d.bits) return d.lanes == 1 ? i : -1;
    return -1;
}

static int count_outputs(const tw_val* v) {
    if (v->kind != TW_TUPLE) return 1;
    int n = 0;
    for (int32_t i = 0; i < v->ndim; ++i) n += count_outputs((const tw_val*)v->data + i);
    return n;
}

static int flatten(tw_model* m, const tw_val* v, tw_tensor* out, int max, int* k) {
    if (v->kind == TW_TUPLE) {
        for (int32_t i = 0; i < v->ndim; ++i)
            if (flatten(m, (const tw_val*)v->data + i, out, max, k)) return 1;
        return 0;
    }
    if (v->kind != TW_TENSOR) return twrt_fail(m, "output %d is not a tensor (the C API returns tensors only)", *k);
    if (*k < max) {
        int64_t* shape = m->out_shapes + (size_t)(*k) * TW_MAX_NDIM;
        memcpy(shape, v->shape, sizeof(int64_t) * (size_t)v->ndim);
        out[*k].data = v->data;
        out[*k].ndim = v->ndim;
        out[*k].dtype.code = tw__dtypes[v->dtype].dl_code;
        out[*k].dtype.bits = tw__dtypes[v->dtype].dl_bits;
        out[*k].dtype.lanes = 1;
        out[*k].shape = shape;
    }
    ++*k;
    return 0;
}

/* the end of a run: fresh blocks this run did not use go back to the system, pooled blocks a
   failed run did not release go back to the pool */
static void end_run(tw_model* m) {
    tw_block** link = &m->fresh;
    while (*link != NULL) {
        tw_block* b = *link;
        if (!b->used) {
            *link = b->next;
            free(b->raw);
            free(b);
        } else {
            link = &b->next;
        }
    }
    for (tw_block* b = m->pool; b != NULL; b = b->next) b->used = 0;
    free_tuples(m);
    m->sp = 0;
}

/* the name of parameter i of f (its params are ", "-separated) */
static void param_name(char* buf, size_t n, const tw_function_desc* f, int i) {
    const char* p = f->params;
    for (int k = 0; k < i && p != NULL; ++k) {
        p = strstr(p, ", ");
        if (p != NULL) p += 2;
    }
    if (p == NULL) {
        snprintf(buf, n, "?");
        return;
    }
    const char* end = strstr(p, ", ");
    size_t len = end == NULL ? strlen(p) : (size_t)(end - p);
    snprintf(buf, n, "%.*s", (int)(len < 200 ? len : 200), p);
}

/* an input's pointers and rank before any of its fields is read: a shape of ndim dims, data
   for a nonzero element count (a negative dim is left to the shape checks) */
static int check_input(tw_model* m, const tw_function_desc* f, const tw_tensor* t, int i) {
    char name[256];
    param_name(name, sizeof name, f, i);
    if (t->ndim < 0 || t->ndim > TW_MAX_NDIM) return twrt_fail(m, "%s: input %d (%s) has rank %d (at most %d)", f->name, i, name, t->ndim, TW_MAX_NDIM);
    if (t->ndim > 0 && t->shape == NULL) return twrt_fail(m, "%s: input %d (%s): shape is NULL but ndim is %d", f->name, i, name, t->ndim);
    if (t->data != NULL) return 0;
    int64_t n = 1;
    int over = 0;
    for (int32_t d = 0; d < t->ndim; ++d) {
        if (t->shape[d] <= 0) return 0;
        over |= __builtin_mul_overflow(n, t->shape[d], &n);
    }
    char s[512];
    describe_shape(s, sizeof s, t->shape, t->ndim);
    if (over) return twrt_fail(m, "%s: input %d (%s): data is NULL but its shape %s has more than 2^63 - 1 elements", f->name, i, name, s);
    return twrt_fail(m, "%s: input %d (%s): data is NULL but its shape %s has %" PRId64 " element(s)", f->name, i, name, s, n);
}

int tw_model_run(tw_model* m, const char* function, const tw_tensor* inputs, int num_inputs, tw_tensor* outputs, int max_outputs) {
    if (m == NULL) {
        no_model_fail("tw_model_run: model is NULL");
        return -1;
    }
    m->err[0] = 0;
    m->err_kind = TW_ERR_NONE;
    if (function == NULL) {
        twrt_fail(m, "tw_model_run: function is NULL");
        return -1;
    }
    if (inputs == NULL && num_inputs > 0) {
        twrt_fail(m, "tw_model_run: inputs is NULL but num_inputs is %d", num_inputs);
        return -1;
    }
    if (outputs == NULL && max_outputs > 0) {
        twrt_fail(m, "tw_model_run: outputs is NULL but max_outputs is %d", max_outputs);
        return -1;
    }
    const tw_function_desc* f = find_function(function);
    if (f == NULL) {
        twrt_fail(m, "no function '%s' in the model", function);
        return -1;
    }
    if (num_inputs != f->num_inputs) {
        twrt_fail(m, "%s takes %d argument(s) (%s), got %d", f->name, f->num_inputs, f->params, num_inputs);
        return -1;
    }
    for (int i = 0; i < num_inputs; ++i)
        if (check_input(m, f, &inputs[i], i)) return -1;
    /* the last run's outputs end here, unless one of them is an input of this run */
    for (tw_block* b = m->fresh; b != NULL; b = b->next) {
        b->used = 0;
        for (int i = 0; i < num_inputs; ++i) {
            const char* p = (const char*)inputs[i].data;
            if (p >= b->data && p < b->data + (b->cap > 0 ? b->cap : 1)) b->used = 1;
        }
    }
    tw_val* in = twrt_push_regs(m, num_inputs);
    for (int i = 0; i < num_inputs; ++i) {
        const tw_tensor* t = &inputs[i];
        int dt = dtype_of(t->dtype);
        if (dt < 0) {
            twrt_fail(m, "%s: input %d has an unknown dtype (code %u, bits %u, lanes %u)", f->name, i, t->dtype.code, t->dtype.bits, t->dtype.lanes);
            end_run(m);
            return -1;
        }
        in[i].kind = TW_TENSOR;
        in[i].dtype = dt;
        in[i].ndim = t->ndim;
        for (int32_t d = 0; d < t->ndim; ++d) in[i].shape[d] = t->shape[d];
        in[i].data = t->data;
    }
    tw_val ret;
    memset(&ret, 0, sizeof ret);
    if (f->entry(m, in, &ret) != 0) {
        end_run(m);
        return -1;
    }
    int n = count_outputs(&ret);
    if (n > m->out_cap) {
        free(m->out_shapes);
        m->out_shapes = (int64_t*)malloc(sizeof(int64_t) * TW_MAX_NDIM * (size_t)n);
        m->out_cap = m->out_shapes ? n : 0;
        if (m->out_shapes == NULL) {
            twrt_fail(m, "out of memory");
            end_run(m);
            return -1;
        }
    }
    int k = 0;
    int rc = flatten(m, &ret, outputs, max_outputs, &k);
    end_run(m);
    return rc ? -1 : n;
}

/* -- registers and storage ------------------------------------------------------------------ */

tw_val* twrt_push_regs(tw_model* m, int64_t n) {
    tw_val* r = m->stack + m->sp; /* stack_regs covers every chain of calls (no recursion) */
    m->sp += n;
    return r;
}

void twrt_pop_regs(tw_model* m, int64_t n) { m->sp -= n; }

const tw_val* twrt_array(const tw_model* m, int32_t index) { return &m->arrays[index]; }

char* twrt_static_pool(tw_model* m) { return m->static_pool; }

/* the size class of a request of n bytes; -1 when it does not fit in int64 */
static int64_t size_class(int64_t n) {
    if (n <= TW_MIN_CLASS) return TW_MIN_CLASS;
    int bits = 0;
    for (uint64_t v = (uint64_t)n; v; v >>= 1) ++bits;
    int64_t step = (int64_t)1 << (bits - 3), up;
    if (__builtin_add_overflow(n, step - 1, &up)) return -1;
    return up / step * step;
}

static tw_block* new_block(int64_t cap) {
    tw_block* b = (tw_block*)calloc(1, sizeof(tw_block));
    if (b == NULL) return NULL;
    b->data = (char*)aligned_alloc64(cap, &b->raw);
    if (b->data == NULL) {
        free(b);
        return NULL;
    }
    b->cap = cap;
    return b;
}

int twrt_pool_acquire(tw_model* m, tw_val* dst, int64_t nbytes) {
    if (nbytes < 0) return twrt_fail(m, "out of memory: a pooled block of %" PRId64 " bytes (a negative size)", nbytes);
    int64_t cls = size_class(nbytes);
    if (cls < 0) return twrt_fail(m, "out of memory: a pooled block of %" PRId64 " bytes is too large", nbytes);
    tw_block* b = m->pool;
    while (b != NULL && (b->used || b->cap != cls)) b = b->next;
    if (b == NULL) {
        b = new_block(cls);
        if (b == NULL) return twrt_fail(m, "out of memory: a pooled block of %" PRId64 " bytes", cls);
        b->next = m->pool;
        m->pool = b;
    }
    b->used = 1;
    memset(dst, 0, sizeof *dst);
    dst->kind = TW_STORAGE;
    dst->data = b->data;
    dst->aux = b;
    dst->i = b->cap;
    return 0;
}

void twrt_pool_release(tw_model* m, tw_val* s) {
    (void)m;
    if (s->kind == TW_STORAGE && s->aux != NULL) ((tw_block*)s->aux)->used = 0;
}

void twrt_static_storage(tw_model* m, tw_val* dst, int64_t offset, int64_t capacity) {
    dst->kind = TW_STORAGE;
    dst->data = m->static_pool + offset;
    dst->aux = NULL;
    dst->i = capacity;
}

static void describe_shape(char* buf, size_t n, const int64_t* shape, int32_t ndim) {
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int32_t i = 0; i < ndim && k < n; ++i) k += (size_t)snprintf(buf + k, n - k, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (k < n) snprintf(buf + k, n - k, ndim == 1 ? ",)" : ")");
}

int twrt_alloc_fresh(tw_model* m, tw_val* dst, const tw_val* shape, int32_t dtype) {
    int64_t nbytes = tw__dtypes[dtype].itemsize;
    for (int32_t i = 0; i < shape->ndim; ++i) {
        if (shape->shape[i] < 0) {
            char s[512];
            describe_shape(s, sizeof s, shape->shape, shape->ndim);
            return twrt_fail(m, "negative dimensions are not allowed: cannot allocate a tensor of shape %s", s);
        }
    }
    for (int32_t i = 0; i < shape->ndim; ++i) {
        if (__builtin_mul_overflow(nbytes, shape->shape[i], &nbytes)) {
            char s[512];
            describe_shape(s, sizeof s, shape->shape, shape->ndim);
            return twrt_fail(m, "out of memory: a %s tensor of shape %s is too large (its byte size exceeds 2^63 - 1)", tw__dtypes[dtype].name, s);
        }
    }
    tw_block* b = m->fresh;
    int64_t slack; /* a block more than twice as large (and 4 KiB) is not reused */
    if (__builtin_mul_overflow(nbytes, 2, &slack) || __builtin_add_overflow(slack, 4096, &slack)) slack = INT64_MAX;
    while (b != NULL && (b->used || b->cap < nbytes || b->cap > slack)) b = b->next;
    if (b == NULL) {
        b = new_block(nbytes);
        if (b == NULL) return twrt_fail(m, "out of memory: a tensor of %" PRId64 " bytes", nbytes);
        b->next = m->fresh;
        m->fresh = b;
    }
    b->used = 1;
    dst->kind = TW_TENSOR;
    dst->dtype = dtype;
    dst->ndim = shape->ndim;
    memcpy(dst->shape, shape->shape, sizeof(int64_t) * (size_t)shape->ndim);
    dst->data = b->data;
    dst->aux = NULL;
    return 0;
}

int twrt_carve(tw_model* m, tw_val* dst, const tw_val* storage, const tw_val* shape, int64_t offset, int32_t dtype) {
    int64_t need = tw__dtypes[dtype].itemsize;
    int over = 0, negative = 0;
    for (int32_t i = 0; i < shape->ndim; ++i) {
        negative |= shape->shape[i] < 0;
        over |= __builtin_mul_overflow(need, shape->shape[i], &need);
    }
    over |= __builtin_add_overflow(need, offset, &need);
    if (over || negative || need > storage->i) {
        char s[512];
        describe_shape(s, sizeof s, shape->shape, shape->ndim);
        if (over || negative)
            return twrt_fail(m, "planned storage of %" PRId64 " bytes is too small for a %s tensor of shape %s at offset %" PRId64 " (its byte size exceeds 2^63 - 1)", storage->i, tw__dtypes[dtype].name, s, offset);
        return twrt_fail(m, "planned storage of %" PRId64 " bytes is too small for a %s tensor of shape %s at offset %" PRId64 " (%" PRId64 " bytes): a dim exceeds the upper bound the plan was made for",
                       storage->i, tw__dtypes[dtype].name, s, offset, need);
    }
    dst->kind = TW_TENSOR;
    dst->dtype = dtype;
    dst->ndim = shape->ndim;
    memcpy(dst->shape, shape->shape, sizeof(int64_t) * (size_t)shape->ndim);
    dst->data = (char*)storage->data + offset;
    dst->aux = NULL;
    return 0;
}

/* -- checks -------------------------------------------------------------------------------- */

static void describe(char* buf, size_t n, const tw_val* x) {
    char s[512];
    switch (x->kind) {
    case TW_TENSOR:
        describe_shape(s, sizeof s, x->shape, x->ndim);
        snprintf(buf, n, "a tensor of shape %s and dtype %s", s, tw__dtypes[x->dtype].name);
        break;
    case TW_SHAPE:
    case TW_TUPLE: snprintf(buf, n, "a tuple of %d", x->ndim); break;
    case TW_INT: snprintf(buf, n, "int %" PRId64, x->i); break;
    case TW_FLOAT: snprintf(buf, n, "float %.17g", x->f); break;
    case TW_STORAGE: snprintf(buf, n, "Storage"); break;
    default: snprintf(buf, n, "NoneType None"); break;
    }
}

int twrt_check_tensor_info(tw_model* m, const tw_val* x, int32_t ndim, int32_t dtype, const char* where) {
    char d[700];
    if (x->kind != TW_TENSOR) {
        describe(d, sizeof d, x);
        return twrt_fail(m, "%s expects a tensor, got %s", where, d);
    }
    if (ndim != -1 && x->ndim != ndim) {
        describe_shape(d, sizeof d, x->shape, x->ndim);
        return twrt_fail(m, "%s expects a tensor of rank %d, got rank %d (shape %s)", where, ndim, x->ndim, d);
    }
    if (dtype >= 0 && x->dtype != dtype) return twrt_fail(m, "%s expects dtype %s, got %s", where, tw__dtypes[dtype].name, tw__dtypes[x->dtype].name);
    return 0;
}

int twrt_check_static(tw_model* m, const tw_val* x, int32_t ndim, const int64_t* shape, int32_t dtype, const char* label, const char* where) {
    if (x->kind == TW_TENSOR && x->ndim == ndim && x->dtype == dtype && memcmp(x->shape, shape, sizeof(int64_t) * (size_t)ndim) == 0) return 0;
    char here[1024];
    snprintf(here, sizeof here, "%s %s", where, label);
    if (twrt_check_tensor_info(m, x, ndim, dtype, here)) return 1;
    for (int32_t i = 0; i < ndim; ++i)
        if (x->shape[i] != shape[i]) return twrt_fail(m, "%s: %s.shape[%d] = %" PRId64 " but it must be %" PRId64, here, label, i, x->shape[i], shape[i]);
    return 0;
}

int twrt_check_tuple_info(tw_model* m, const tw_val* x, int32_t size, const char* where) {
    if ((x->kind == TW_TUPLE || x->kind == TW_SHAPE) && x->ndim == size) return 0;
    char d[700];
    describe(d, sizeof d, x);
    return twrt_fail(m, "%s expects a tuple of %d, got %s", where, size, d);
}

int twrt_check_shape_info(tw_model* m, const tw_val* x, int32_t ndim, const char* where) {
    if ((x->kind == TW_TUPLE || x->kind == TW_SHAPE) && (ndim == -1 || x->ndim == ndim)) return 0;
    char d[700];
    describe(d, sizeof d, x);
    return twrt_fail(m, "%s expects a shape of rank %d, got %s", where, ndim, d);
}

int twrt_check_prim_info(tw_model* m, const tw_val* x, const char* dtype, const char* where) {
    if ((x->kind == TW_TENSOR && x->ndim == 0) || x->kind == TW_INT || x->kind == TW_FLOAT) return 0;
    char d[700];
    describe(d, sizeof d, x);
    return twrt_fail(m, "%s expects a %s value, got %s", where, dtype ? dtype : "scalar", d);
}

static int64_t elem_i64(const tw_val* x, int64_t k) {
    const char* p = (const char*)x->data;
    const char* name = tw__dtypes[x->dtype].name;
    switch (tw__dtypes[x->dtype].dl_code) {
    case TW_DTYPE_BOOL: return ((const uint8_t*)p)[k] != 0;
    case TW_DTYPE_UINT: return ((const uint8_t*)p)[k];
    case TW_DTYPE_INT:
        switch (tw__dtypes[x->dtype].dl_bits) {
        case 8: return ((const int8_t*)p)[k];
        case 16: return ((const int16_t*)p)[k];
        case 32: return ((const int32_t*)p)[k];
        default: return ((const int64_t*)p)[k];
        }
    default:
        if (strcmp(name, "float32") == 0) return (int64_t)((const float*)p)[k];
        if (strcmp(name, "float64") == 0) return (int64_t)((const double*)p)[k];
        if (strcmp(name, "bfloat16") == 0) {
            uint32_t u = (uint32_t)((const uint16_t*)p)[k] << 16;
            float f;
            memcpy(&f, &u, 4);
            return (int64_t)f;
        }
        return 0; /* float16 values never name dims */
    }
}

int64_t twrt_int_of(const tw_val* x) {
    if (x->kind == TW_INT) return x->i;
    if (x->kind == TW_FLOAT) return (int64_t)x->f;
    if (x->kind == TW_TENSOR) return elem_i64(x, 0);
    return 0;
}

int twrt_match_shape(tw_model* m, const tw_val* x, tw_heap* h, const int64_t* codes, int32_t ncodes, const char* where, const char* label) {
    int scalar = (x->kind != TW_TENSOR && x->kind != TW_SHAPE && x->kind != TW_TUPLE) || (x->kind == TW_TENSOR && x->ndim == 0 && ncodes == 2);
    int32_t ndims = scalar ? 1 : x->ndim;
    char at[1024];
    for (int32_t i = 0; i < ncodes / 2; ++i) {
        int64_t code = codes[2 * i], op = codes[2 * i + 1];
        if (code == 3) continue;
        if (i >= ndims) return twrt_fail(m, "%s: %s has %d dims, %d are matched", where, label, ndims, ncodes / 2);
        int64_t d = scalar ? twrt_int_of(x) : x->shape[i];
#define TW_AT() (scalar ? snprintf(at, sizeof at, "%s", label) : snprintf(at, sizeof at, "%s[%d]", label, i))
        if (code == 0) {
            if (d < h->lo[op] || (h->has_hi[op] && d > h->hi[op])) {
                TW_AT();
                if (h->has_hi[op] && d > h->hi[op]) return twrt_fail(m, "%s: %s = %" PRId64 " but %s <= %" PRId64, where, at, d, h->names[op], h->hi[op]);
                return twrt_fail(m, "%s: %s = %" PRId64 " but %s >= %" PRId64, where, at, d, h->names[op], h->lo[op]);
            }
            h->v[op] = d;
            h->olab[op] = label;
            h->odim[op] = scalar ? -1 : i;
        } else if (code == 1) {
            if (d != op) {
                TW_AT();
                return twrt_fail(m, "%s: %s = %" PRId64 " but it must be %" PRId64, where, at, d, op);
            }
        } else if (code == 2) {
            if (d != h->v[op]) {
                char bound[1100] = "";
                TW_AT();
                if (h->olab[op] != NULL) {
                    if (h->odim[op] < 0) snprintf(bound, sizeof bound, ", bound by %s", h->olab[op]);
                    else snprintf(bound, sizeof bound, ", bound by %s[%d]", h->olab[op], h->odim[op]);
                }
                return twrt_fail(m, "%s: %s = %" PRId64 " but %s = %" PRId64 "%s", where, at, d, h->names[op], h->v[op], bound);
            }
        }
#undef TW_AT
    }
    return 0;
}

void twrt_heap_reset(tw_heap* h) {
    for (int32_t i = 0; i < h->size; ++i) {
        h->v[i] = 0;
        h->olab[i] = NULL;
        h->odim[i] = -1;
    }
}

/* "h // 2 = 0" for slot s, or "" for a constant's slot (its name is its value) */
static void slot_value(char* buf, size_t n, const tw_heap* h, int32_t s) {
    char v[32];
    snprintf(v, sizeof v, "%" PRId64, h->v[s]);
    if (strcmp(h->names[s], v) == 0) buf[0] = 0;
    else snprintf(buf, n, "%s = %s", h->names[s], v);
}

int twrt_dim_fail(tw_model* m, const tw_heap* h, int32_t a, int32_t b, const char* where, const char* message) {
    char va[1100], vb[1100];
    slot_value(va, sizeof va, h, a);
    slot_value(vb, sizeof vb, h, b);
    if (a == b) vb[0] = 0;
    if (va[0] == 0 && vb[0] == 0) return twrt_fail(m, "%s: %s", where, message);
    return twrt_fail(m, "%s: %s: %s%s%s", where, message, va, va[0] && vb[0] ? ", " : "", vb);
}

int twrt_div_zero(tw_model* m) { return twrt_fail(m, "a derived dim divides by zero"); }

int twrt_dim_overflow(tw_model* m) { return twrt_fail(m, "a derived dim overflows int64 (its value exceeds 2^63 - 1)"); }

/* -- values ---------------------------------------------------------------------------------- */

int twrt_view(tw_model* m, tw_val* dst, const tw_val* x, const tw_val* shape) {
    if (x->kind != TW_TENSOR) return twrt_fail(m, "a view of a value that is not a tensor");
    int64_t n = 1;
    int over = 0;
    for (int32_t i = 0; i < shape->ndim; ++i) over |= __builtin_mul_overflow(n, shape->shape[i], &n);
    if (over || n != twrt_numel(x)) {
        char s[512];
        describe_shape(s, sizeof s, shape->shape, shape->ndim);
        return twrt_fail(m, "cannot reshape array of size %" PRId64 " into shape %s", twrt_numel(x), s);
    }
    tw_val v = *x;
    v.ndim = shape->ndim;
    memcpy(v.shape, shape->shape, sizeof(int64_t) * (size_t)shape->ndim);
    *dst = v;
    return 0;
}

int twrt_read_if_cond(tw_model* m, const tw_val* x, tw_val* dst) {
    int64_t c;
    if (x->kind == TW_TENSOR) {
        if (twrt_numel(x) != 1) {
            char s[512];
            describe_shape(s, sizeof s, x->shape, x->ndim);
            return twrt_fail(m, "an If condition must be a scalar, got a tensor of shape %s", s);
        }
        if (tw__dtypes[x->dtype].dl_code == TW_DTYPE_FLOAT || tw__dtypes[x->dtype].dl_code == TW_DTYPE_BFLOAT) {
            double f = strcmp(tw__dtypes[x->dtype].name, "float64") == 0 ? *(const double*)x->data : strcmp(tw__dtypes[x->dtype].name, "float32") == 0 ? *(const float*)x->data : (double)elem_i64(x, 0);
            c = f != 0.0;
        } else {
            c = elem_i64(x, 0) != 0;
        }
    } else if (x->kind == TW_INT) {
        c = x->i != 0;
    } else if (x->kind == TW_FLOAT) {
        c = x->f != 0.0;
    } else if (x->kind == TW_SHAPE || x->kind == TW_TUPLE) {
        c = x->ndim != 0;
    } else {
        c = x->kind != TW_NONE;
    }
    memset(dst, 0, sizeof *dst);
    dst->kind = TW_INT;
    dst->i = c;
    return 0;
}

int twrt_make_tuple(tw_model* m, tw_val* dst, int32_t n, const tw_val* const* fields) {
    tw_chunk* c = (tw_chunk*)malloc(sizeof(tw_val) * (size_t)(n + 1));
    if (c == NULL) return twrt_fail(m, "out of memory");
    c->next = m->tuples;
    m->tuples = c;
    tw_val* f = (tw_val*)c + 1;
    for (int32_t i = 0; i < n; ++i) f[i] = *fields[i];
    memset(dst, 0, sizeof *dst);
    dst->kind = TW_TUPLE;
    dst->ndim = n;
    dst->data = f;
    return 0;
}

int twrt_tuple_getitem(tw_model* m, tw_val* dst, const tw_val* t, int64_t index) {
    if (t->kind == TW_SHAPE) {
        if (index < 0 || index >= t->ndim) return twrt_fail(m, "tuple index out of range");
        int64_t v = t->shape[index];
        memset(dst, 0, sizeof *dst);
        dst->kind = TW_INT;
        dst->i = v;
        return 0;
    }
    if (t->kind != TW_TUPLE || index < 0 || index >= t->ndim) return twrt_fail(m, "tuple index out of range");
    *dst = ((const tw_val*)t->data)[index];
    return 0;
}

int twrt_shape_of(tw_model* m, tw_val* dst, const tw_val* x) {
    if (x->kind != TW_TENSOR) return twrt_fail(m, "shape_of a value that is not a tensor");
    tw_val v;
    memset(&v, 0, sizeof v);
    v.kind = TW_SHAPE;
    v.ndim = x->ndim;
    memcpy(v.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    *dst = v;
    return 0;
}

int twrt_tensor_to_shape(tw_model* m, tw_val* dst, const tw_val* x) {
    if (x->kind != TW_TENSOR) return twrt_fail(m, "tensor_to_shape of a value that is not a tensor");
    int64_t n = twrt_numel(x);
    if (n > TW_MAX_NDIM) return twrt_fail(m, "a shape of %" PRId64 " dims from a tensor (the export holds at most %d)", n, TW_MAX_NDIM);
    tw_val v;
    memset(&v, 0, sizeof v);
    v.kind = TW_SHAPE;
    v.ndim = (int32_t)n;
    for (int64_t k = 0; k < n; ++k) v.shape[k] = elem_i64(x, k);
    *dst = v;
    return 0;
}

int twrt_kernel_fail(tw_model* m, const char* name, int32_t rc) {
    if (rc == 2) { /* tw_check_nonzero: the source framework raises here (docs/semantics.md) */
        twrt_fail(m, "kernel %s: integer division by zero (the source framework raises here, e.g. torch's ZeroDivisionError)", name);
        m->err_kind = TW_ERR_ZERO_DIVISION;
        return 1;
    }
    if (rc == 4) { /* tw_check_range: the source framework raises here (docs/semantics.md) */
        twrt_fail(m, "kernel %s: an index is out of range (the source framework raises here, e.g. torch's IndexError)", name);
        m->err_kind = TW_ERR_INDEX;
        return 1;
    }
    if (rc == 3) /* a reduction over an empty domain whose schedule keeps its init inside */
        return twrt_fail(m, "kernel %s: a reduction over an empty domain, which this schedule cannot run", name);
    return twrt_fail(m, "kernel %s: scratch memory could not be allocated (code %d)", name, rc);
}
