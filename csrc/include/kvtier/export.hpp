#pragma once

/// Marks what the kvtier shared library exports: the public API in these headers, nothing
/// else (the library is built with -fvisibility=hidden and -fvisibility-inlines-hidden).
#define KVTIER_EXPORT __attribute__((visibility("default")))
/// Keeps a class nested in an exported one (an implementation, a private part) out of the
/// library's symbol table.
#define KVTIER_HIDDEN __attribute__((visibility("hidden")))
