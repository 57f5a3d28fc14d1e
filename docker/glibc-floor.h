/* The farm's glibc floor for libm (design.md §8.3).
 *
 * glibc 2.27 gave expf, exp2f, logf, log2f and powf new symbol versions, and glibc 2.29 did the
 * same for exp, exp2, log, log2 and pow: faster code that no longer goes through the old SVID
 * error wrapper. The sysroot's headers (glibc 2.31) make every call bind the new versions, which
 * puts a wheel above torch's manylinux_2_28. The old versions are still in every glibc and give
 * the same results (errno included, as POSIX mode has always been the default), so each compile
 * through the toolchain's wrappers force-includes this header and binds them instead.
 *
 * Compiles only: `-E` output that nvcc later compiles with `-c` must not carry these twice.
 * Assembler sources and 32-bit or x32 targets are left alone.
 */
#ifndef FARM_GLIBC_FLOOR_H
#define FARM_GLIBC_FLOOR_H
#if !defined(__ASSEMBLER__) && defined(__linux__) && !defined(__ILP32__)
#  if defined(__x86_64__)
#    define FARM_GLIBC_FIRST "GLIBC_2.2.5"
#  elif defined(__aarch64__)
#    define FARM_GLIBC_FIRST "GLIBC_2.17"
#  endif
#  ifdef FARM_GLIBC_FIRST
#    define FARM_GLIBC_BIND_FIRST(name) __asm__(".symver " #name "," #name "@" FARM_GLIBC_FIRST)
FARM_GLIBC_BIND_FIRST(exp);
FARM_GLIBC_BIND_FIRST(exp2);
FARM_GLIBC_BIND_FIRST(log);
FARM_GLIBC_BIND_FIRST(log2);
FARM_GLIBC_BIND_FIRST(pow);
FARM_GLIBC_BIND_FIRST(expf);
FARM_GLIBC_BIND_FIRST(exp2f);
FARM_GLIBC_BIND_FIRST(logf);
FARM_GLIBC_BIND_FIRST(log2f);
FARM_GLIBC_BIND_FIRST(powf);
#    undef FARM_GLIBC_BIND_FIRST
#  endif
#  undef FARM_GLIBC_FIRST
#endif
#endif
