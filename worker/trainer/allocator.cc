// hyscale-train allocates and frees the same large activation tensors every step. Returning
// their pages to the OS after each free makes every new tensor page-fault again, which measured
// ~40x slower than reuse on the CPU machines here (docs/performance.md). jemalloc reads this
// setting at startup: keep freed pages for reuse, never purge them.
extern "C" {
const char* malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";
}
