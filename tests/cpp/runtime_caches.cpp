// A clean program that leans on the C and C++ runtimes' caches (stdio, locale, regex, name
// service, resolver, time zone, dlopen, threads, exceptions): with malloc=1 nothing of theirs
// may be reported. With "busy", a thread still runs at exit, so the caches are left alone.

#include <k15/memory.h>

#include <dlfcn.h>
#include <netdb.h>
#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <iostream>
#include <locale>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

int main(int argc, char** argv) {
    std::cout << "hello " << 42 << std::endl;
    std::regex pattern("([a-z]+)-([0-9]+)");
    std::smatch match;
    const std::string text = "level-12";
    std::regex_search(text, match, pattern);
    std::ostringstream formatted;
    formatted.imbue(std::locale("C"));
    formatted << 3.25;
    struct passwd* user = getpwuid(getuid());
    struct addrinfo* address = nullptr;
    if (getaddrinfo("localhost", "80", nullptr, &address) == 0) freeaddrinfo(address);
    if (void* libm = dlopen("libm.so.6", RTLD_NOW)) dlclose(libm);
    const std::time_t now = std::time(nullptr);
    const std::string date = std::ctime(&now);
    std::thread worker([] { std::cout << "worker\n"; });
    worker.join();
    try {
        throw std::runtime_error("caught");
    } catch (const std::exception& e) {
        std::cout << e.what() << ' ' << match[2] << ' ' << formatted.str() << ' ' << (user != nullptr) << ' '
                  << date.size() << "\n";
    }
    if (argc > 1 && std::string(argv[1]) == "busy") {
        std::thread([] { std::this_thread::sleep_for(std::chrono::hours(1)); }).detach();
    }
    std::cout << "done";  // no newline: flushed at exit all the same
}
