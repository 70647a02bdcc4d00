/*
 * ECS_API marks what libecstore exports.  The library is built with
 * -fvisibility=hidden, so a function is part of the ABI exactly when its
 * declaration in include/ecstore/ carries this mark; everything else (the
 * server, the object index, the transports) stays inside the library.
 * tests/abi_symbols.sh checks that the exported symbols and the marked
 * declarations are the same set.
 */
#ifndef ECSTORE_EXPORT_H
#define ECSTORE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define ECS_API __attribute__((visibility("default")))
#else
#define ECS_API
#endif

#endif
