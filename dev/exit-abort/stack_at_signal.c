/* Preloaded into a process (LD_PRELOAD), prints the native stack when the process gets
 * SIGABRT (glibc's "double free or corruption" aborts) or SIGSEGV, then dies of the
 * signal as it would have: a stack where gdb is missing. Names come from each library's
 * exported symbols; otherwise the library and the offset.
 *   bash dev/exit-abort/build_stack_at_signal.sh   (here: writes build/stack_at_signal.so)
 *   LD_PRELOAD=$PWD/build/stack_at_signal.so python3 ...                        */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

static void print_stack(int sig) {
    void *frames[128];
    int n = backtrace(frames, 128);
    static const char head[] = "\n--- native stack at the signal ---\n";
    write(2, head, sizeof head - 1);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc_s now: not inside a handler, on a corrupt heap */
    signal(SIGABRT, print_stack);
    signal(SIGSEGV, print_stack);
}
