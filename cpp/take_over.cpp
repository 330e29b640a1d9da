// Taking the global operator new/delete over after the process has started. A shared library
// that holds the tracker and is loaded by dlopen finds every module's calls of the operators
// already bound to libstdc++'s (the dynamic linker searches the executable and the libraries
// loaded at start first). Each loaded module's relocations of them (its GOT and PLT slots) are
// pointed at this module's operators, and those of dlopen too, so that modules loaded later are
// redirected as they come. Blocks libstdc++ served before are handed back to it when freed.
// Operators that are not libstdc++'s (a program's own replacement) are left alone.

#include "entry.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace k15::memory::detail {

namespace {

// Every replaceable global operator new/delete (Itanium ABI names, LP64), and dlopen.
const char* const redirected_names[] = {
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
    "dlopen",
};
constexpr std::size_t redirected_count = sizeof redirected_names / sizeof redirected_names[0];
constexpr std::size_t dlopen_index = redirected_count - 1;

// What each slot gets, by the index above; written once, before any slot is.
void* redirect_to[redirected_count];

using Dlopen = void* (*)(const char*, int);
Dlopen process_dlopen;

// Inclusive-exclusive address range.
struct Range {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    bool holds(std::uintptr_t address) const { return address >= begin && address < end; }
};

// The dynamic linker has relocated most of a module's dynamic entries in place (absolute); the
// vDSO's are not.
std::uintptr_t absolute(std::uintptr_t base, std::uintptr_t value) { return value < base ? value + base : value; }

void write_slot(void** slot, void* target, const Range& read_only_after_relocation) {
    if (*slot == target) return;
    const auto address = reinterpret_cast<std::uintptr_t>(slot);
    if (!read_only_after_relocation.holds(address)) {
        *slot = target;
        return;
    }
    const auto page_size = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    void* page = reinterpret_cast<void*>(address & ~(page_size - 1));
    if (mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0) return;
    *slot = target;
    mprotect(page, page_size, PROT_READ);
}

struct Tables {
    std::uintptr_t base = 0;
    const ElfW(Sym)* symbols = nullptr;
    const char* names = nullptr;
    Range read_only;
};

void redirect_relocations(const Tables& tables, const ElfW(Rela)* relocations, std::size_t bytes) {
    if (relocations == nullptr || tables.symbols == nullptr || tables.names == nullptr) return;
    for (std::size_t i = 0; i < bytes / sizeof(ElfW(Rela)); ++i) {
        const ElfW(Rela)& relocation = relocations[i];
        const auto type = ELF64_R_TYPE(relocation.r_info);
        const bool whole_address = type == R_X86_64_JUMP_SLOT || type == R_X86_64_GLOB_DAT ||
                                   (type == R_X86_64_64 && relocation.r_addend == 0);
        const auto symbol = ELF64_R_SYM(relocation.r_info);
        if (!whole_address || symbol == 0) continue;
        const char* name = tables.names + tables.symbols[symbol].st_name;
        for (std::size_t which = 0; which < redirected_count; ++which) {
            if (std::strcmp(name, redirected_names[which]) != 0) continue;
            write_slot(reinterpret_cast<void**>(tables.base + relocation.r_offset), redirect_to[which], tables.read_only);
            break;
        }
    }
}

int redirect_module(dl_phdr_info* module, std::size_t, void*) {
    Tables tables;
    tables.base = module->dlpi_addr;
    const ElfW(Dyn)* dynamic = nullptr;
    for (ElfW(Half) i = 0; i < module->dlpi_phnum; ++i) {
        const ElfW(Phdr)& header = module->dlpi_phdr[i];
        if (header.p_type == PT_DYNAMIC) dynamic = reinterpret_cast<const ElfW(Dyn)*>(tables.base + header.p_vaddr);
        if (header.p_type == PT_GNU_RELRO) {
            tables.read_only.begin = tables.base + header.p_vaddr;
            tables.read_only.end = tables.read_only.begin + header.p_memsz;
        }
    }
    if (dynamic == nullptr) return 0;
    const ElfW(Rela)* relocations = nullptr;
    const ElfW(Rela)* plt_relocations = nullptr;
    std::size_t relocation_bytes = 0;
    std::size_t plt_relocation_bytes = 0;
    for (const ElfW(Dyn)* entry = dynamic; entry->d_tag != DT_NULL; ++entry) {
        const std::uintptr_t pointer = absolute(tables.base, entry->d_un.d_ptr);
        switch (entry->d_tag) {
            case DT_SYMTAB: tables.symbols = reinterpret_cast<const ElfW(Sym)*>(pointer); break;
            case DT_STRTAB: tables.names = reinterpret_cast<const char*>(pointer); break;
            case DT_RELA: relocations = reinterpret_cast<const ElfW(Rela)*>(pointer); break;
            case DT_RELASZ: relocation_bytes = entry->d_un.d_val; break;
            case DT_JMPREL: plt_relocations = reinterpret_cast<const ElfW(Rela)*>(pointer); break;
            case DT_PLTRELSZ: plt_relocation_bytes = entry->d_un.d_val; break;
            default: break;
        }
    }
    redirect_relocations(tables, relocations, relocation_bytes);
    redirect_relocations(tables, plt_relocations, plt_relocation_bytes);
    return 0;
}

// dlsym on a module's handle also searches its dependencies (libstdc++): only this module's own
// definitions will do.
bool defined_here(void* symbol) {
    Dl_info where{};
    Dl_info here{};
    return dladdr(symbol, &where) != 0 && dladdr(reinterpret_cast<void*>(&redirect_module), &here) != 0 &&
           where.dli_fbase == here.dli_fbase;
}

void* dlopen_then_redirect(const char* file, int mode) {
    void* handle = process_dlopen(file, mode);
    if (handle != nullptr) dl_iterate_phdr(redirect_module, nullptr);
    return handle;
}

}  // namespace

bool take_over_operators(void* own_module) noexcept {
    // Before any slot changes, and even if none can: blocks the tracker did not serve are the
    // process's allocator's, and go back to it.
    const auto original_delete = reinterpret_cast<void (*)(void*)>(dlsym(RTLD_DEFAULT, "_ZdlPv"));
    if (original_delete == nullptr) return false;
    k15_memory_pass_foreign_blocks_to(original_delete);
    // Only libstdc++'s operators are taken over: a program's own replacement (or another
    // allocator's) serves blocks that its inlined or direct calls free, which the tracker must
    // not come between.
    void* libstdcxx = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (own_module == nullptr || libstdcxx == nullptr ||
        dlsym(libstdcxx, "_Znwm") != dlsym(RTLD_DEFAULT, "_Znwm")) {
        return false;
    }
    for (std::size_t which = 0; which < dlopen_index; ++which) {
        redirect_to[which] = dlsym(own_module, redirected_names[which]);
        if (redirect_to[which] == nullptr || !defined_here(redirect_to[which])) return false;
    }
    process_dlopen = reinterpret_cast<Dlopen>(dlsym(RTLD_DEFAULT, "dlopen"));
    if (process_dlopen == nullptr) return false;
    redirect_to[dlopen_index] = reinterpret_cast<void*>(&dlopen_then_redirect);
    dl_iterate_phdr(redirect_module, nullptr);
    return true;
}

}  // namespace k15::memory::detail
