/* tests/interpose-next.c: built twice, as libinterpose-next-a.so
 * (WO_NEXT_ID 'a') and libinterpose-next-b.so ('b'), both linked into
 * test-interpose-driver in that order. Each defines wo_next_probe(); a's
 * wo_next_from_a() asks dlsym(RTLD_NEXT) for it, which must find b's: the
 * next definition after the *caller*, even though the shim's dlsym hook is
 * what the call reaches. */
#include <dlfcn.h>

int wo_next_probe(void);
int wo_next_from_a(void);
int wo_next_b_marker(void);

__attribute__((visibility("default"))) int wo_next_probe(void)
{
    return WO_NEXT_ID;
}

#if WO_NEXT_ID == 'a'
__attribute__((visibility("default"))) int wo_next_from_a(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "wo_next_probe");
    return next ? next() : -1;
}
#else
/* Referenced by the test so --as-needed keeps this library. */
__attribute__((visibility("default"))) int wo_next_b_marker(void)
{
    return WO_NEXT_ID;
}
#endif
