/* tilework ahead-of-time export: what the generated model code (model.c) and the runtime
 * (tw_runtime.c) share. Not part of the public API (tw_model.h).
 *
 * A tw_val is one register of the Python VM: a tensor (data, dtype, shape), a shape value (a
 * tuple of ints), an int, a float, a tuple (fields), planned storage (data, capacity) or None.
 * The generated code translates each bytecode instruction into C over these registers; the
 * helpers below do what the VM builtins of the same name do (tilework/runtime/builtins.py),
 * with the same error messages. */
#ifndef TILEWORK_INTERNAL_H
#define TILEWORK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "tw_model.h"

#define TW_MAX_NDIM 16

enum { TW_NONE = 0, TW_TENSOR, TW_SHAPE, TW_INT, TW_FLOAT, TW_TUPLE, TW_STORAGE };

typedef struct tw_val {
    int32_t kind;
    int32_t dtype; /* tensor: index into tw__dtypes */
    int32_t ndim;  /* tensor rank, shape length, tuple size */
    int32_t pad_;
    void* data; /* tensor data, storage bytes, tuple fields (tw_val*) */
    void* aux;  /* pooled storage: its block */
    int64_t i;  /* int value, storage capacity */
    double f;
    int64_t shape[TW_MAX_NDIM]; /* tensor shape, shape values */
} tw_val;

typedef struct {
    const char* name;
    int32_t itemsize;
    uint8_t dl_code, dl_bits;
} tw_dtype_desc;

/* The shape heap of one call of a graph function: slot values, and for messages the slot
   names, bounds and where each var was bound in this call. */
typedef struct {
    int64_t* v;
    const char* const* names;
    const int64_t* lo;
    const int64_t* hi;
    const uint8_t* has_hi;
    const char** olab;
    int32_t* odim;
    int32_t size;
} tw_heap;

typedef int (*tw_entry_fn)(tw_model* m, const tw_val* inputs, tw_val* ret);

typedef struct {
    const char* name;
    int32_t num_inputs;
    const char* params; /* the input names, ", "-separated (for messages) */
    tw_entry_fn entry;
} tw_function_desc;

/* What model.c describes: the weights file it expects and its functions. */
typedef struct {
    uint64_t id;
    int32_t num_arrays;
    const int64_t* array_nbytes;
    const int32_t* array_dtype;
    const int32_t* array_ndim;
    const int64_t* array_shape; /* TW_MAX_NDIM per array */
    int64_t static_bytes;
    int64_t stack_regs;
    int32_t num_functions;
    const tw_function_desc* functions;
} tw_export_info;

extern const tw_export_info tw__info;
extern const tw_dtype_desc tw__dtypes[];
extern const int32_t tw__num_dtypes;

/* -- runtime services used by model.c ----------------------------------------------------- */
int twrt_fail(tw_model* m, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
tw_val* twrt_push_regs(tw_model* m, int64_t n);
void twrt_pop_regs(tw_model* m, int64_t n);
const tw_val* twrt_array(const tw_model* m, int32_t index);
char* twrt_static_pool(tw_model* m);

void twrt_heap_reset(tw_heap* h);
int twrt_check_tensor_info(tw_model* m, const tw_val* x, int32_t ndim, int32_t dtype, const char* where);
int twrt_check_static(tw_model* m, const tw_val* x, int32_t ndim, const int64_t* shape, int32_t dtype, const char* label, const char* where);
int twrt_check_tuple_info(tw_model* m, const tw_val* x, int32_t size, const char* where);
int twrt_check_shape_info(tw_model* m, const tw_val* x, int32_t ndim, const char* where);
int twrt_check_prim_info(tw_model* m, const tw_val* x, const char* dtype, const char* where);
int twrt_match_shape(tw_model* m, const tw_val* x, tw_heap* h, const int64_t* codes, int32_t ncodes, const char* where, const char* label);
/* a failed vm_check_dims check of slots a and b: the VM's message (the slots' names and values) */
int twrt_dim_fail(tw_model* m, const tw_heap* h, int32_t a, int32_t b, const char* where, const char* message);
int twrt_div_zero(tw_model* m);
int twrt_dim_overflow(tw_model* m);
int twrt_alloc_fresh(tw_model* m, tw_val* dst, const tw_val* shape, int32_t dtype);
int twrt_pool_acquire(tw_model* m, tw_val* dst, int64_t nbytes);
void twrt_pool_release(tw_model* m, tw_val* storage);
void twrt_static_storage(tw_model* m, tw_val* dst, int64_t offset, int64_t capacity);
int twrt_carve(tw_model* m, tw_val* dst, const tw_val* storage, const tw_val* shape, int64_t offset, int32_t dtype);
int twrt_view(tw_model* m, tw_val* dst, const tw_val* x, const tw_val* shape);
int twrt_read_if_cond(tw_model* m, const tw_val* x, tw_val* dst);
int twrt_make_tuple(tw_model* m, tw_val* dst, int32_t n, const tw_val* const* fields);
int twrt_tuple_getitem(tw_model* m, tw_val* dst, const tw_val* t, int64_t index);
int twrt_shape_of(tw_model* m, tw_val* dst, const tw_val* x);
int twrt_tensor_to_shape(tw_model* m, tw_val* dst, const tw_val* x);
int twrt_kernel_fail(tw_model* m, const char* name, int32_t rc);
int64_t twrt_int_of(const tw_val* x);

/* the element count of a tensor that exists (its bytes were allocated: no overflow) */
static inline int64_t twrt_numel(const tw_val* x) {
    int64_t n = 1;
    for (int32_t i = 0; i < x->ndim; ++i) n *= x->shape[i];
    return n;
}

static inline int64_t twrt_i(const tw_val* x) { return x->kind == TW_INT ? x->i : twrt_int_of(x); }

/* + and * on dims; *bad is set to 2 on int64 overflow (Python's ints do not overflow) */
static inline int64_t twrt_add(int64_t a, int64_t b, int* bad) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) { if (!*bad) *bad = 2; return 0; }
    return r;
}
static inline int64_t twrt_mul(int64_t a, int64_t b, int* bad) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) { if (!*bad) *bad = 2; return 0; }
    return r;
}

/* Python's floor division and modulo on dims; *bad is set to 1 when b is 0 */
static inline int64_t twrt_floordiv(int64_t a, int64_t b, int* bad) {
    if (b == 0) { if (!*bad) *bad = 1; return 0; }
    if (b == -1) return twrt_mul(a, -1, bad);
    int64_t q = a / b, r = a % b;
    return q - ((r != 0) & ((r < 0) != (b < 0)));
}
static inline int64_t twrt_floormod(int64_t a, int64_t b, int* bad) {
    if (b == 0) { if (!*bad) *bad = 1; return 0; }
    if (b == -1) return 0;
    int64_t r = a % b;
    return ((r != 0) & ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t twrt_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t twrt_max(int64_t a, int64_t b) { return a > b ? a : b; }

#define TW_TRY(e) do { if ((e) != 0) return 1; } while (0)

#endif
