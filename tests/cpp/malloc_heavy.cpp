// A C-style program: linked lists, strdup'd names and a realloc-grown table, most of it freed,
// some lists dropped on the floor (valgrind's referee for the C family).

#include <k15/memory.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct Node {
    Node* next;
    char* name;
    double value;
};

Node* build_list(int count, int seed) {
    Node* head = nullptr;
    for (int i = 0; i < count; ++i) {
        auto* node = static_cast<Node*>(calloc(1, sizeof(Node)));
        char label[32];
        std::snprintf(label, sizeof label, "node-%d-%d", seed, i);
        node->name = strdup(label);
        node->value = seed * 1000.0 + i;
        node->next = head;
        head = node;
    }
    return head;
}

void free_list(Node* head) {
    while (head != nullptr) {
        Node* next = head->next;
        free(head->name);
        free(head);
        head = next;
    }
}

double sum_table(int rows) {
    double* table = nullptr;
    for (int i = 0; i < rows; ++i) {
        table = static_cast<double*>(realloc(table, (i + 1) * sizeof(double)));
        table[i] = i * 0.5;
    }
    double sum = 0;
    for (int i = 0; i < rows; ++i) sum += table[i];
    free(table);
    return sum;
}

}  // namespace

int main() {
    double total = 0;
    for (int round = 0; round < 20; ++round) {
        Node* list = build_list(50, round);
        total += list->value + sum_table(100 + round);
        if (round % 5 == 0) {
            continue;  // leaked: 1 node definitely, 99 blocks indirectly
        }
        free_list(list);
    }
    std::fprintf(stderr, "total %.1f\n", total);  // stderr: unbuffered, so no stdio buffer is left
}
